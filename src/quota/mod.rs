//! Quota admission with Kueue semantics (issue 4).
