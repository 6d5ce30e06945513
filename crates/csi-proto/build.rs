//! Compiles the vendored `proto/csi.proto` with protox (pure Rust, no `protoc`) into tonic servers and
//! clients for every CSI service.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    let descriptors = protox::compile(["csi.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
