mod common;
use common::*;

#[test]
fn echo_append_cat_roundtrip() {
    let m = Mount::new();
    m.sh_ok("echo a > f; echo b >> f");
    assert_eq!(m.sh_ok("cat f"), "a\nb\n");
}
