# What `cmake --install` puts beside the worker SDK (worker_sdk/CMakeLists.txt) for the crun
# packages (scripts/package.sh, docs/install.md): the crun executable, the docs, and a systemd
# unit for `crun rendezvous`; and CPack's Debian package of all of it under /usr.
include(GNUInstallDirs)
install(TARGETS crun RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
# The unit names the executable by absolute path, so it is written at install time, for the
# prefix being installed to (/usr in the Debian package, /usr/local in the tarball).
install(CODE "
  set(CRUN_INSTALL_BINDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}\")
  set(CRUN_INSTALL_DOCDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DOCDIR}\")
  set(unit \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/lib/systemd/system/crun-rendezvous.service\")
  message(STATUS \"Installing: \${unit}\")
  configure_file(\"${PROJECT_SOURCE_DIR}/packaging/crun-rendezvous.service.in\" \"\${unit}\" @ONLY)
")

set(CPACK_PACKAGE_NAME crun)
set(CPACK_PACKAGE_VENDOR "crun")
set(CPACK_PACKAGE_CONTACT "crun maintainers <crun@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Elastic launcher for distributed training (torchrun-compatible) and its worker SDK")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)  # executables; the archives: packaging/strip_archives.cmake
set(CPACK_PRE_BUILD_SCRIPTS ${PROJECT_SOURCE_DIR}/packaging/strip_archives.cmake)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
# The C library crun needs, worked out from the binary by dpkg-shlibdeps.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The SDK's CMake package finds these when a program uses its Gloo or libtorch parts.
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "libgloo-dev, libtorch-dev")
include(CPack)
