//! The process's malloc, tuned once at start.
//!
//! glibc gives each thread that allocates its own arena (up to eight per core) and keeps
//! what each one freed. The runtime's worker and blocking threads build multi-megabyte
//! answers at 10,000 routes, and that kept about 90 MB more resident than two arenas do;
//! this workload does not contend on malloc enough to need more.

/// Holds glibc to two arenas. Call it first thing in `main` (and in a benchmark that reports
/// the RSS the product would have), before any other thread exists.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn limit_arenas() {
    // SAFETY: mallopt only sets a malloc parameter, and no other thread exists yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Other allocators need no tuning here.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn limit_arenas() {}
