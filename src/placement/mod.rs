//! Placement engine: picks a node and GPU(s) for a request (issue 6).
