//! The process's malloc, tuned once at start.
//!
//! glibc gives each thread that allocates its own arena (up to eight per core) and keeps
//! what each one freed. The runtime's worker and blocking threads build multi-megabyte
//! answers at 10,000 routes, and that kept about 90 MB more resident than two arenas do;
//! this workload does not contend on malloc enough to need more.
//!
//! glibc also raises its mmap threshold each time a large block is freed (up to 32 MB), after
//! which multi-megabyte answers (`/api/v1/status`, `/metrics`, the figures read for them) are
//! carved out of the heap and their pages stay resident between requests. A fixed threshold
//! keeps such blocks mapped on their own, so freeing one gives its memory back.

/// Blocks at least this large are mapped on their own and unmapped when freed.
pub const MMAP_THRESHOLD: i32 = 256 * 1024;

/// Holds glibc to two arenas and a fixed mmap threshold. Call it first thing in `main` (and
/// in a benchmark that reports the RSS the product would have), before any other thread exists.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn tune() {
    // SAFETY: mallopt only sets malloc parameters, and no other thread exists yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Other allocators need no tuning here.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() {}

/// How often [`trim_every`] runs in `serve`.
pub const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Gives the pages malloc holds free back to the system every `period`, for a long-running
/// process whose heap has held a burst (a provider-wide outage, a 10 MB answer): glibc
/// returns only the top of its heaps by itself, and what a burst leaves free in the middle
/// would otherwise stay resident until it is reused. `release` runs first, to free what is
/// held only as a cache (the store's idle connections). Never returns.
pub async fn trim_every(period: std::time::Duration, release: impl Fn() + Clone + Send + 'static) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let release = release.clone();
        // Walks the arenas under their locks: off the runtime's worker threads.
        let _ = tokio::task::spawn_blocking(move || {
            release();
            trim();
        })
        .await;
    }
}

/// Gives the free pages back now (blocking: call it from a blocking thread), after work that
/// freed many megabytes of small blocks at once.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn trim() {
    // SAFETY: malloc_trim is thread-safe; it only releases free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() {}
