//! buffet-cli
