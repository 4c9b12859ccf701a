# What `cmake --install` puts under the prefix, and so what the wheel carries
# under site-packages/dshim/ (pyproject.toml):
#   bin/dshim-run, bin/dshim-bench            the launcher and the benchmark
#   <libdir>/libdshim.so (+ libdshim-cuda.so where nvcc built it)
#   include/dshim.h                           the public C API
#   <libdir>/pkgconfig/dshim.pc               pkg-config --cflags --libs dshim
#   <libdir>/cmake/dshim/                     find_package(dshim) -> dshim::dshim
# Every path below is relative to the prefix, so an installed tree can be moved
# (the wheel is one such move): dshim-run finds libdshim.so from its own path,
# dshim-bench through an $ORIGIN RPATH, pkg-config through ${pcfiledir}.
include(CMakePackageConfigHelpers)

# bin/ -> libdir, as dshim-run and dshim-bench see it from where they run
file(RELATIVE_PATH DSHIM_LIB_FROM_BIN /${CMAKE_INSTALL_BINDIR} /${CMAKE_INSTALL_LIBDIR})
target_compile_definitions(dshim_run_lib PRIVATE DSHIM_RUN_LIB_FROM_BIN="${DSHIM_LIB_FROM_BIN}")
set_target_properties(dshim-bench PROPERTIES INSTALL_RPATH "$ORIGIN/${DSHIM_LIB_FROM_BIN}")

target_include_directories(dshim INTERFACE $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>
                                           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
install(TARGETS dshim EXPORT dshimTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${CMAKE_SOURCE_DIR}/include/dshim.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS dshim-run dshim-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET dshim-cuda)
  # a plugin libdshim.so dlopens from its own directory (shim/gpu/cuda_loader.c), never linked
  install(TARGETS dshim-cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()

# pkg-config: the prefix is found from the .pc file's own place
file(RELATIVE_PATH DSHIM_PREFIX_FROM_PCDIR /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" DSHIM_PREFIX_FROM_PCDIR "${DSHIM_PREFIX_FROM_PCDIR}")
configure_file(${CMAKE_SOURCE_DIR}/cmake/dshim.pc.in ${CMAKE_BINARY_DIR}/dshim.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/dshim.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# CMake package: find_package(dshim) gives the imported target dshim::dshim
set(DSHIM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/dshim)
install(EXPORT dshimTargets NAMESPACE dshim:: DESTINATION ${DSHIM_CMAKE_DIR})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/dshimConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/dshimConfig.cmake INSTALL_DESTINATION ${DSHIM_CMAKE_DIR})
# 0.x: a minor release may change the API, so only the same MAJOR.MINOR is compatible
write_basic_package_version_file(${CMAKE_BINARY_DIR}/dshimConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/dshimConfig.cmake ${CMAKE_BINARY_DIR}/dshimConfigVersion.cmake
        DESTINATION ${DSHIM_CMAKE_DIR})

# The wheel's dshim/_version.py: the version (from dshim.h, as the wheel's metadata) and the torch
# that `make test` tested this code with (scripts/setup.sh installs it: that is its one home)
if(SKBUILD)
  file(STRINGS ${CMAKE_SOURCE_DIR}/scripts/setup.sh _dshim_torch_line REGEX "^TORCH_VERSION=")
  string(REGEX REPLACE "^TORCH_VERSION=" "" DSHIM_TESTED_TORCH "${_dshim_torch_line}")
  configure_file(${CMAKE_SOURCE_DIR}/cmake/_version.py.in ${CMAKE_BINARY_DIR}/_version.py @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/_version.py DESTINATION .)
endif()
