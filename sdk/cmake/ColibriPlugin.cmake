# colibri_add_plugin(<name> KIND <compute|storage|cache> SOURCES ... [LINK_LIBRARIES ...]
#                    [OUTPUT_DIRECTORY <dir>] [NO_INSTALL])
#
# Builds a plugin the way the loader expects it: a MODULE library named
# libcolibri-<kind>-<name>.so, hidden visibility, only the entry symbol exported, installed to
# <libdir>/colibri/plugins. The target is called colibri-<kind>-<name>.
set_property(GLOBAL PROPERTY COLIBRI_PLUGIN_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")

function(colibri_add_plugin name)
  cmake_parse_arguments(ARG "NO_INSTALL" "KIND;OUTPUT_DIRECTORY" "SOURCES;LINK_LIBRARIES" ${ARGN})
  if(NOT ARG_KIND MATCHES "^(compute|storage|cache)$")
    message(FATAL_ERROR "colibri_add_plugin(${name}): KIND must be compute, storage or cache (got '${ARG_KIND}')")
  endif()
  if(NOT name MATCHES "^[a-z0-9_-]+$")
    message(FATAL_ERROR "colibri_add_plugin(${name}): plugin names use only a-z, 0-9, '_' and '-'")
  endif()
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "colibri_add_plugin(${name}): SOURCES is empty")
  endif()

  get_property(_COLIBRI_PLUGIN_CMAKE_DIR GLOBAL PROPERTY COLIBRI_PLUGIN_CMAKE_DIR)
  set(target "colibri-${ARG_KIND}-${name}")
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE colibri::sdk ${ARG_LINK_LIBRARIES})
  target_compile_features(${target} PRIVATE cxx_std_20)
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME "${target}"
    CXX_VISIBILITY_PRESET hidden
    C_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    POSITION_INDEPENDENT_CODE ON)
  target_link_options(${target} PRIVATE "LINKER:--version-script=${_COLIBRI_PLUGIN_CMAKE_DIR}/colibri-plugin.map")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${_COLIBRI_PLUGIN_CMAKE_DIR}/colibri-plugin.map")
  # Unresolved symbols fail at link time, not when a user loads the plugin (sanitizer runtimes
  # live in the executable, so the check is off there and in fuzzing builds).
  if(NOT COLIBRI_SANITIZE AND NOT COLIBRI_TSAN AND NOT COLIBRI_FUZZ)
    target_link_options(${target} PRIVATE "LINKER:--no-undefined")
  endif()

  if(ARG_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${ARG_OUTPUT_DIRECTORY}")
  elseif(DEFINED COLIBRI_PLUGIN_BUILD_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${COLIBRI_PLUGIN_BUILD_DIR}")
  endif()

  if(NOT ARG_NO_INSTALL)
    include(GNUInstallDirs)
    install(TARGETS ${target} LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}/colibri/plugins" COMPONENT runtime)
  endif()
endfunction()
