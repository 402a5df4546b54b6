//! buffet-io
