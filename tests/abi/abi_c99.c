/* Compiled as strict C99 with -Werror: the build fails if abi.h stops being plain C. */
#include <skyforge/abi.h>

int skyforge_abi_is_c(void) { return (int)sizeof(sf_plugin_descriptor) > 0; }
