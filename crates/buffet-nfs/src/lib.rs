//! buffet-nfs
