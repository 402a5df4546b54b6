//! The `buffet` command with `my-nf` registered: every subcommand and flag of `buffet`,
//! and `--nf my-nf` selects this crate's NF.
#![forbid(unsafe_code)]

buffet::nf_main!("my-nf" => my_nf::MyNf);
