//! `libtessera_cuda.so`: the CUDA intercept library (see issue 3 and design.md "Shim contract").
