# TIERFS_CHECK_CUDA: find nvcc, cuda.h and libcuda (driver API, stubs allowed).
# --with-cuda[=DIR] makes CUDA mandatory; --without-cuda disables it; the default
# probes /usr/local/cuda and uses it when complete.  Sets have_cuda, CUDA_CPPFLAGS,
# CUDA_LDFLAGS, CUDA_LIBS, NVCC, NVCC_ARCH, NVCC_GENCODE (the targets of the
# embedded kernels, gpu/gpu_hash.cu: sm_80 and sm_90 code and compute_90 PTX,
# which later GPUs JIT-compile).
AC_DEFUN([TIERFS_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@], [build the GPU tier with CUDA (default: auto, DIR=/usr/local/cuda)])],
    [], [with_cuda=auto])
  AC_ARG_VAR([NVCC_ARCH], [nvcc -arch value for GPU code (default sm_90)])
  AS_IF([test -z "$NVCC_ARCH"], [NVCC_ARCH=sm_90])
  AC_ARG_VAR([NVCC_GENCODE], [nvcc -gencode options of the embedded kernels (default: sm_80, sm_90, compute_90 PTX)])
  AS_IF([test -z "$NVCC_GENCODE"],
    [NVCC_GENCODE="-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90"])
  have_cuda=no
  cuda_summary=
  AS_CASE([$with_cuda],
    [no], [cuda_summary="(disabled)"],
    [yes|auto], [cuda_dir=/usr/local/cuda],
    [cuda_dir=$with_cuda])
  AS_IF([test "x$with_cuda" != xno], [
    AC_PATH_PROG([NVCC], [nvcc], [no], [$cuda_dir/bin:$PATH])
    save_CPPFLAGS=$CPPFLAGS; save_LDFLAGS=$LDFLAGS; save_LIBS=$LIBS
    CUDA_CPPFLAGS="-I$cuda_dir/include"
    CUDA_LDFLAGS="-L$cuda_dir/lib64 -L$cuda_dir/lib64/stubs"
    CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS"; LDFLAGS="$LDFLAGS $CUDA_LDFLAGS"
    AC_CHECK_HEADER([cuda.h], [cuda_h=yes], [cuda_h=no])
    AC_CHECK_LIB([cuda], [cuMemAddressReserve], [cuda_lib=yes], [cuda_lib=no])
    CPPFLAGS=$save_CPPFLAGS; LDFLAGS=$save_LDFLAGS; LIBS=$save_LIBS
    AS_IF([test "x$NVCC" != xno && test "x$cuda_h" = xyes && test "x$cuda_lib" = xyes],
      [have_cuda=yes; CUDA_LIBS="-lcuda"; cuda_summary="($cuda_dir, kernels: $NVCC_GENCODE)"
       AC_DEFINE([HAVE_CUDA], [1], [Build the CUDA GPU tier])],
      [cuda_summary="(not found: nvcc=$NVCC cuda.h=$cuda_h libcuda=$cuda_lib)"
       AS_IF([test "x$with_cuda" != xauto], [AC_MSG_ERROR([CUDA requested but $cuda_summary])])])
  ])
  AC_SUBST([CUDA_CPPFLAGS])
  AC_SUBST([CUDA_LDFLAGS])
  AC_SUBST([CUDA_LIBS])
  AC_SUBST([NVCC])
])
