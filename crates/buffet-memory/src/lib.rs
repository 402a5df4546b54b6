//! buffet-memory
