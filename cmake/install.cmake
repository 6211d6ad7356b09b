# `cmake --install`: liboptfuse.so, the public headers, the optfuse command, the committed
# schedule databases, an exported CMake package (find_package(optfuse CONFIG) gives
# optfuse::optfuse) and a pkg-config file (optfuse.pc). CTest builds consumers against the
# installed tree both ways (tests/consumer/).
include(CMakePackageConfigHelpers)

set(OPTFUSE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/optfuse)
install(DIRECTORY include/optfuse DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY schedules/ DESTINATION ${CMAKE_INSTALL_DATADIR}/optfuse/schedules
  FILES_MATCHING PATTERN "*.json")
if(TARGET optfuse-cli)
  install(TARGETS optfuse-cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
if(TARGET optfuse_shared)
  install(TARGETS optfuse_shared EXPORT optfuseTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT optfuseTargets NAMESPACE optfuse:: DESTINATION ${OPTFUSE_CMAKE_DIR})
  configure_package_config_file(cmake/optfuseConfig.cmake.in
    ${CMAKE_CURRENT_BINARY_DIR}/optfuseConfig.cmake INSTALL_DESTINATION ${OPTFUSE_CMAKE_DIR})
  write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/optfuseConfigVersion.cmake
    COMPATIBILITY SameMinorVersion)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/optfuseConfig.cmake
    ${CMAKE_CURRENT_BINARY_DIR}/optfuseConfigVersion.cmake DESTINATION ${OPTFUSE_CMAKE_DIR})
  # Relocatable: the prefix is found from the .pc file's own place (cmake --install --prefix).
  file(RELATIVE_PATH OPTFUSE_PC_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
  configure_file(cmake/optfuse.pc.in ${CMAKE_CURRENT_BINARY_DIR}/optfuse.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/optfuse.pc
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()
