//! Fleet simulator on public cluster traces (issue 6).
