# skyforge_add_plugin(<name> SOURCES <src>... [PLUGIN_TOML <file>] [OUTPUT_DIR <dir>] [NO_INSTALL])
#
# Builds a skyforge plugin: a MODULE library with hidden visibility that links the SDK, placed
# with its plugin.toml in <OUTPUT_DIR>/<name>/ (a directory the host can search). `cmake
# --install` puts both in <prefix>/<SKYFORGE_PLUGIN_SUBDIR>/<name>/ (lib/skyforge/plugins: the
# host's own plugin directory when <prefix> is skyforge's); NO_INSTALL leaves it out (fixtures). PLUGIN_TOML
# defaults to plugin.toml beside the CMakeLists; @SKYFORGE_PLUGIN_LIBRARY@ in it is replaced
# with the library's file name. Its `abi = "major.minor"` is the ABI the plugin requires: it is
# compiled into the library (SKYFORGE_PLUGIN_ABI_MINOR, read by sdk.hpp and the descriptor), so
# the file and the binary always agree, and a plugin that says "1.0" loads in every 1.x host. An
# abi this SDK cannot build (another major, a newer minor) stops the configure, naming the line.

# The SDK's plugin ABI, read once from the abi.h that plugins compile against: beside this file
# in skyforge's sources, where skyforgeConfig.cmake says (SKYFORGE_ABI_HEADER) in an install.
# Global properties, so that skyforge_add_plugin() sees them from any directory.
if(NOT SKYFORGE_ABI_HEADER)
  set(SKYFORGE_ABI_HEADER ${CMAKE_CURRENT_LIST_DIR}/../include/skyforge/abi.h)
endif()
file(STRINGS ${SKYFORGE_ABI_HEADER} _skyforge_abi_defines REGEX "^#define SKYFORGE_ABI_M(AJ|IN)OR [0-9]+$")
foreach(_define IN LISTS _skyforge_abi_defines)
  if(_define MATCHES "^#define (SKYFORGE_ABI_M(AJ|IN)OR) ([0-9]+)$")
    set_property(GLOBAL PROPERTY ${CMAKE_MATCH_1} ${CMAKE_MATCH_3})
  endif()
endforeach()
get_property(_skyforge_abi_major GLOBAL PROPERTY SKYFORGE_ABI_MAJOR)
if(_skyforge_abi_major STREQUAL "")
  message(FATAL_ERROR "${SKYFORGE_ABI_HEADER}: no #define SKYFORGE_ABI_MAJOR (is the skyforge SDK installed whole?)")
endif()

# _skyforge_plugin_abi_minor(<plugin.toml> <name> <configured plugin.toml> <out>): the minor of
# the file's `abi = "major.minor"` line. A missing or malformed line, another major than the
# SDK's (no host of this major loads it, however it is built) or a minor newer than the SDK's
# stops the configure with file:line, the value and what is expected, after removing the
# plugin.toml an earlier configure wrote, so that no build tree pairs a stale one with the library.
function(_skyforge_plugin_abi_minor toml name configured out)
  get_property(_major GLOBAL PROPERTY SKYFORGE_ABI_MAJOR)
  get_property(_minor GLOBAL PROPERTY SKYFORGE_ABI_MINOR)
  file(READ ${toml} _text)
  string(PREPEND _text "\n")
  set(_problem "")
  if(NOT _text MATCHES "\n([ \t]*abi[ \t]*=[^\n]*)")
    set(_problem "${toml}: plugin '${name}' has no abi line (the plugin ABI it requires)")
  else()
    set(_line_text "${CMAKE_MATCH_1}")
    string(FIND "${_text}" "\n${_line_text}" _at)
    string(SUBSTRING "${_text}" 0 ${_at} _before)
    string(REGEX MATCHALL "\n" _newlines "${_before}")
    list(LENGTH _newlines _line)
    math(EXPR _line "${_line} + 1")
    string(STRIP "${_line_text}" _line_text)
    set(_where "${toml}:${_line}: plugin '${name}': ${_line_text}")
    if(NOT _line_text MATCHES "^abi[ \t]*=[ \t]*\"([0-9]+)\\.([0-9]+)\"[ \t]*(#.*)?$")
      set(_problem "${_where}: not a version \"major.minor\"")
    elseif(NOT CMAKE_MATCH_1 EQUAL _major)
      string(CONCAT _problem "${_where}: plugin ABI major ${CMAKE_MATCH_1}, but this skyforge SDK is ABI "
                             "${_major}.${_minor} and a host loads only plugins of its own major (${_major})")
    elseif(CMAKE_MATCH_2 GREATER _minor)
      set(_problem "${_where}: newer than this skyforge SDK, ABI ${_major}.${_minor} (build against a newer skyforge)")
    endif()
  endif()
  if(NOT _problem STREQUAL "")
    file(REMOVE ${configured})
    message(FATAL_ERROR "${_problem}; expected abi = \"${_major}.N\", N at most ${_minor}: the oldest "
                        "minor whose features the plugin needs (docs/plugins.md, \"The ABI\")")
  endif()
  set(${out} ${CMAKE_MATCH_2} PARENT_SCOPE)
endfunction()

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
  _skyforge_plugin_abi_minor(${ARG_PLUGIN_TOML} ${name} ${ARG_OUTPUT_DIR}/${name}/plugin.toml _abi_minor)
  target_compile_definitions(${name} PRIVATE SKYFORGE_PLUGIN_ABI_MINOR=${_abi_minor})
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
