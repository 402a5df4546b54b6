//! buffet-worker
