//! Identities, limits and admissions cannot be made outside this crate, and
//! page memory cannot be asked for by owner: each case below must fail to
//! compile, with the error recorded beside it.

#[test]
fn forging_an_identity_limits_or_an_admission_does_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
