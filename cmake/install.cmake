# Installation and packaging of mc2, included from the top-level
# CMakeLists.txt once the libraries exist. `cmake --install BUILD --prefix P`
# puts into P:
#   include/mc2/*.h                      the public API
#   lib/libmc2.so.0.1.0 (+ .so.0, .so)   the shared library (SOVERSION 0)
#   lib/libmc2.a                         the static library
#   lib/libmc2_models.so.0.1.0 (+ .so.0, .so), lib/libmc2_models.a
#                                        the reference models (<mc2/models.h>),
#                                        on top of libmc2
#   bin/mc2                              the command (rule in tools/)
#   lib/cmake/mc2/                       the CMake package: mc2::mc2 (shared),
#                                        mc2::mc2_static, mc2::models (shared)
#                                        and mc2::models_static
#   lib/pkgconfig/mc2.pc, mc2_models.pc  the pkg-config files
# ("lib" is CMAKE_INSTALL_LIBDIR.) Everything installed is relocatable: the
# package and the .pc file find the prefix relative to their own location,
# so `--prefix` at install time works whatever prefix was configured.
# mc2::models links mc2::mc2 (mc2_models.pc requires mc2), so a consumer of
# the models names only them.
#
# Consumers need no fmt or nlohmann_json headers: the public headers include
# only <mc2/...> and std. The static library's link dependencies (fmt,
# Threads, rt; nlohmann_json is header-only but named by the target) are
# found again by mc2Config.cmake and listed in mc2.pc's *.private fields.

include(CMakePackageConfigHelpers)

set(MC2_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/mc2
    CACHE STRING "Where to install the mc2 CMake package (relative to the prefix)")

# In-tree code can use the same names as consumers of the package.
if(NOT TARGET mc2::mc2_static)
  add_library(mc2::mc2_static ALIAS mc2_static)
endif()

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/mc2
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT mc2_development
        FILES_MATCHING PATTERN "*.h")

install(TARGETS mc2 mc2_static mc2_models_shared mc2_models_static
        EXPORT mc2Targets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
                COMPONENT mc2_runtime
                NAMELINK_COMPONENT mc2_development
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT mc2_development
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT mc2_runtime)
# (The include directory comes from the targets' INSTALL_INTERFACE.)

install(EXPORT mc2Targets
        NAMESPACE mc2::
        FILE mc2Targets.cmake
        DESTINATION ${MC2_INSTALL_CMAKEDIR}
        COMPONENT mc2_development)

configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/mc2Config.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/mc2Config.cmake
  INSTALL_DESTINATION ${MC2_INSTALL_CMAKEDIR})
# 0.x: a minor release may break the API, so only 0.1.* satisfies 0.1.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/cmake/mc2ConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/mc2Config.cmake
              ${PROJECT_BINARY_DIR}/cmake/mc2ConfigVersion.cmake
        DESTINATION ${MC2_INSTALL_CMAKEDIR}
        COMPONENT mc2_development)

# pkg-config. The prefix is derived from the .pc file's own directory
# (${pcfiledir}), which keeps it right after `cmake --install --prefix`.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(MC2_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(MC2_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(MC2_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH mc2_pc_up "/mc2-root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/mc2-root")
  string(REGEX REPLACE "/$" "" mc2_pc_up "${mc2_pc_up}")
  set(MC2_PC_PREFIX "\${pcfiledir}/${mc2_pc_up}")
  set(MC2_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(MC2_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/mc2.pc.in ${PROJECT_BINARY_DIR}/cmake/mc2.pc @ONLY)
configure_file(${CMAKE_CURRENT_LIST_DIR}/mc2_models.pc.in ${PROJECT_BINARY_DIR}/cmake/mc2_models.pc
               @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/cmake/mc2.pc ${PROJECT_BINARY_DIR}/cmake/mc2_models.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT mc2_development)
