# Fails when a binary is linked against CUDA, cuBLAS, cuDNN or NCCL (ldd): only the cuda
# backend may load them (docs/compute-backends.md, "The cuda engine (in progress)").
# Usage: cmake -DBINARIES="a;b" -P check_no_cuda.cmake
foreach(bin IN LISTS BINARIES)
  execute_process(COMMAND ldd ${bin} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ldd ${bin} failed: ${err}")
  endif()
  string(REGEX MATCHALL "lib(cuda|cudart|cublas|cublasLt|cudnn|nccl)[^ ]*" hits "${out}")
  if(hits)
    message(FATAL_ERROR "${bin} links ${hits}")
  endif()
  message(STATUS "${bin}: no CUDA library")
endforeach()
