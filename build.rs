//! Build script: with the `ffi` feature, generates and compiles the C++ side
//! of the cxx bridge (`src/ffi.rs`). The generated header lands in
//! `$OUT_DIR/cxxbridge/include/deepnvme/src/ffi.rs.h`, where the Python build
//! (bindings/setup.py) finds it for the torch shims. The bridge itself
//! includes only torch-free headers, so this needs no torch and no CUDA.

fn main() {
    #[cfg(feature = "ffi")]
    {
        cxx_build::bridge("src/ffi.rs")
            .include("cpp/include")
            .std("c++17")
            .flag_if_supported("-fPIC")
            .compile("deepnvme-cxxbridge");
        println!("cargo:rerun-if-changed=src/ffi.rs");
        println!("cargo:rerun-if-changed=cpp/include/deepspeed_aio_op_desc.h");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
