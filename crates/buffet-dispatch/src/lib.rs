//! buffet-dispatch
