# crun_find_nccl_library(VAR): NCCL's library, from NCCL_ROOT (a pip wheel's nvidia/nccl, which
# has only libnccl.so.2) or the CUDA toolkit. NAMES_PER_DIR: NCCL_ROOT's library wins even where
# the toolkit has a libnccl.so of another version, so that header and library match. Used by the
# build (worker_sdk/CMakeLists.txt) and by the installed package (crun_workerConfig.cmake).
macro(crun_find_nccl_library var)
  find_library(${var} NAMES nccl libnccl.so.2 NAMES_PER_DIR
    HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_LIBRARY_DIR}
    PATH_SUFFIXES lib lib64)
endmacro()
