//! No code is generated here. leasefs depends on `protoc-bin-vendored` as a
//! build-dependency so that cargo fetches it before any build script runs:
//! the etcd client's build script compiles .proto files with the protoc that
//! crate ships, through `build-support/protoc` (named by .cargo/config.toml),
//! so a build needs no system protobuf compiler nor its include files.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if let Err(e) = protoc_bin_vendored::protoc_bin_path() {
        println!("cargo:warning={e}: set PROTOC to a protoc with its include files");
    }
}
