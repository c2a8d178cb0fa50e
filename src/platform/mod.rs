//! The platform's long-running processes: the worker roles (generating
//! and embedding), the gateway,
//! the control plane, the leak prober and the batch runner, what workers register and report,
//! and `up`, which starts and supervises them all on one machine.

pub(crate) mod batch_runner;
pub(crate) mod control_plane;
pub(crate) mod embed_worker;
pub(crate) mod gateway;
pub(crate) mod prober;
pub(crate) mod register;
pub(crate) mod up;
mod usage_report;
pub(crate) mod worker;
