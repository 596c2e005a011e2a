//! Test support: models, workload generators and seeded simulation.
pub mod ceph;
pub mod store;
