//! The kube-scheduler extender (`tessera controller --extender-addr`): places pods that
//! ask for vGPUs HAMi's way (`nvidia.com/gpumem`, `gpucores`) with no node lock.
//!
//! - [`wire`]: the extender v1 JSON types (`k8s.io/kube-scheduler/extender/v1`);
//! - [`records`]: the Node record the agent publishes and the assignment a bind writes
//!   on the pod (pure);
//! - [`state`]: the books of every vGPU node, synced from those records; filter,
//!   prioritize and bind's reserve call the pure [`crate::vgpu`] engine;
//! - [`server`]: the HTTP shell, the bind's writes, the watch loop.
//!
//! The protocol and its race analysis: docs/hami.md, "The scheduler extender".

pub mod records;
pub mod server;
pub mod state;
pub mod wire;

pub use server::{keep_books, serve, Extender};
pub use state::{Books, BooksConfig};
