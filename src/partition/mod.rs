//! (node agent; being built under issue 2)
