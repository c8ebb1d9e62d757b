# skyforge_add_plugin(<name> SOURCES <src>... [PLUGIN_TOML <file>] [OUTPUT_DIR <dir>] [NO_INSTALL])
#
# Builds a skyforge plugin: a MODULE library with hidden visibility that links the SDK, placed
# with its plugin.toml in <OUTPUT_DIR>/<name>/ (a directory the host can search). `cmake
# --install` puts both in <prefix>/<SKYFORGE_PLUGIN_SUBDIR>/<name>/ (lib/skyforge/plugins: the
# host's own plugin directory when <prefix> is skyforge's); NO_INSTALL leaves it out (fixtures). PLUGIN_TOML
# defaults to plugin.toml beside the CMakeLists; @SKYFORGE_PLUGIN_LIBRARY@ in it is replaced
# with the library's file name. Its `abi = "major.minor"` is the ABI the plugin requires: it is
# compiled into the library (SKYFORGE_PLUGIN_ABI_MINOR, read by sdk.hpp and the descriptor), so
# the file and the binary always agree, and a plugin that says "1.0" loads in every 1.x host.
function(skyforge_add_plugin name)
  cmake_parse_arguments(ARG "NO_INSTALL" "PLUGIN_TOML;OUTPUT_DIR" "SOURCES" ${ARGN})
  if(NOT ARG_PLUGIN_TOML)
    set(ARG_PLUGIN_TOML ${CMAKE_CURRENT_SOURCE_DIR}/plugin.toml)
  endif()
  if(NOT ARG_OUTPUT_DIR)
    if(SKYFORGE_PLUGIN_BUILD_DIR)
      set(ARG_OUTPUT_DIR ${SKYFORGE_PLUGIN_BUILD_DIR})
    else()
      set(ARG_OUTPUT_DIR ${CMAKE_BINARY_DIR}/plugins)
    endif()
  endif()
  add_library(${name} MODULE ${ARG_SOURCES})
  if(TARGET skyforge::sdk)
    target_link_libraries(${name} PRIVATE skyforge::sdk)
  endif()
  set_target_properties(${name} PROPERTIES
    PREFIX "lib"
    CXX_VISIBILITY_PRESET hidden
    C_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR}/${name})
  file(STRINGS ${ARG_PLUGIN_TOML} _abi_line REGEX "^[ \t]*abi[ \t]*=")
  if(_abi_line MATCHES "\"([0-9]+)\\.([0-9]+)\"")
    target_compile_definitions(${name} PRIVATE SKYFORGE_PLUGIN_ABI_MINOR=${CMAKE_MATCH_2})
  else()
    message(FATAL_ERROR "${ARG_PLUGIN_TOML}: expected a line abi = \"major.minor\" (the plugin ABI it requires)")
  endif()
  # Export exactly one symbol (docs/plugins.md): hidden visibility alone still lets libstdc++'s
  # weak template instantiations escape, so a version script makes everything else local.
  set(_vs ${CMAKE_CURRENT_BINARY_DIR}/${name}.exports.map)
  file(WRITE ${_vs} "{\n  global: skyforge_plugin_entry;\n  local: *;\n};\n")
  target_link_options(${name} PRIVATE "LINKER:--version-script=${_vs}")
  set_property(TARGET ${name} APPEND PROPERTY LINK_DEPENDS ${_vs})
  set(SKYFORGE_PLUGIN_LIBRARY "lib${name}.so")
  configure_file(${ARG_PLUGIN_TOML} ${ARG_OUTPUT_DIR}/${name}/plugin.toml @ONLY)
  if(NOT ARG_NO_INSTALL AND SKYFORGE_PLUGIN_SUBDIR)
    install(TARGETS ${name} LIBRARY DESTINATION ${SKYFORGE_PLUGIN_SUBDIR}/${name})
    install(FILES ${ARG_OUTPUT_DIR}/${name}/plugin.toml DESTINATION ${SKYFORGE_PLUGIN_SUBDIR}/${name})
  endif()
endfunction()
