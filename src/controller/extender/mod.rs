//! The kube-scheduler extender (`tessera controller --extender-addr`): places pods that
//! ask for vGPUs HAMi's way (`nvidia.com/gpumem`, `gpucores`) with no node lock.
//!
//! - [`wire`]: the extender v1 JSON types (`k8s.io/kube-scheduler/extender/v1`);
//! - [`records`]: the Node record the agent publishes and the assignment a bind writes
//!   on the pod (pure);
//! - [`engine`]: the placement engine `tessera simulate` measures, over the books:
//!   prioritize's scores and bind's GPUs (pure);
//! - [`state`]: the books of every vGPU node, synced from those records; filter and
//!   bind's reserve call the pure [`crate::vgpu`] books, prioritize and bind's choice
//!   of GPUs the [`engine`];
//! - [`replay`]: a pod list replayed through filter, prioritize and bind as the
//!   scheduler would call them, under `tessera simulate`'s protocol (pure);
//! - [`server`]: the HTTP shell, the bind's writes, the watch loop.
//!
//! The protocol and its race analysis: docs/hami.md, "The scheduler extender".

pub mod engine;
pub mod records;
pub mod replay;
pub mod server;
pub mod state;
pub mod wire;

pub use server::{keep_books, serve, Extender};
pub use state::{Books, BooksConfig};
