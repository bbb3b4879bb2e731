# CPack pre-build script (CPACK_PRE_BUILD_SCRIPTS): the SDK's static libraries lose their
# debug sections (not their symbols) before they are packed: 38 MiB of DWARF otherwise.
# scripts/package.sh does the same for the tarball.
file(GLOB_RECURSE archives "${CPACK_TEMPORARY_INSTALL_DIRECTORY}/*.a")
foreach(archive IN LISTS archives)
  execute_process(COMMAND strip --strip-debug "${archive}" COMMAND_ERROR_IS_FATAL ANY)
endforeach()
