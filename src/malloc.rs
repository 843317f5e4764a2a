//! The process's allocators: jemalloc for Rust's allocations, glibc's malloc, tuned once at
//! start, for what C code allocates (SQLite's page caches and statements).
//!
//! jemalloc serves every Rust allocation. The proxy allocates and frees a hundred small blocks
//! per request across the runtime's threads and the store's writer thread, and glibc's
//! arenas spent a tenth of a request's instructions on that (callgrind), with more under
//! contention; jemalloc's thread caches take it with less. Its background thread hands pages
//! freed after a burst back to the system after a few seconds, also while the process idles.
//!
//! glibc gives each thread that allocates its own arena (up to eight per core) and keeps
//! what each one freed; two arenas are enough for SQLite's allocations. glibc also raises its
//! mmap threshold each time a large block is freed (up to 32 MB), after which large blocks
//! are carved out of the heap and their pages stay resident; a fixed threshold keeps such
//! blocks mapped on their own, so freeing one gives its memory back.

#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static JEMALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once before `main` (the build adds `background_thread:true`;
/// `_RJEM_MALLOC_CONF` in the environment overrides both). A thread cache is swept for
/// blocks to hand back to the arenas each time its thread has allocated
/// `tcache_gc_incr_bytes` (64 KiB by default): every request or so on the proxy, where
/// sweeping cost about 3k instructions a request (2%, callgrind). Every 1 MiB it costs a
/// tenth of that; what a cache may hold is bounded per size class either way.
#[cfg(not(target_env = "msvc"))]
#[used]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: Option<&'static std::ffi::c_char> =
    // SAFETY: a pointer to the first byte of a static, NUL-terminated string.
    Some(unsafe { &*c"tcache_gc_incr_bytes:1048576".as_ptr() });

/// Blocks at least this large are mapped on their own and unmapped when freed.
pub const MMAP_THRESHOLD: i32 = 256 * 1024;

/// Holds glibc's malloc to two arenas and a fixed mmap threshold. Call it first thing in
/// `main` (and in a benchmark that reports the RSS the product would have), before any other
/// thread exists.
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

/// Gives the pages the allocators hold free back to the system every `period`, for a
/// long-running process whose heap has held a burst (a provider-wide outage, a 10 MB answer):
/// glibc returns only the top of its heaps by itself, and what a burst leaves free in the
/// middle would otherwise stay resident until it is reused. `release` runs first, to free what
/// is held only as a cache (the store's idle connections). Never returns.
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
/// freed many megabytes of small blocks at once: jemalloc's unused dirty pages (rather than
/// after its decay of a few seconds) and glibc's free heap pages.
pub fn trim() {
    #[cfg(not(target_env = "msvc"))]
    // SAFETY: `arena.<all>.purge` reads and writes nothing (null pointers, length 0) and
    // only releases unused pages; the name is NUL-terminated. Best effort: its result is not
    // needed.
    unsafe {
        const PURGE_ALL: &[u8] = b"arena.4096.purge\0"; // 4096: MALLCTL_ARENAS_ALL
        let (old, old_len, new) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        tikv_jemalloc_sys::mallctl(PURGE_ALL.as_ptr().cast(), old, old_len, new, 0);
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim is thread-safe; it only releases free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(all(test, not(target_env = "msvc")))]
mod tests {
    #[test]
    fn jemalloc_reads_its_options_from_here() {
        let mut value: usize = 0;
        let mut len = std::mem::size_of::<usize>();
        // SAFETY: `opt.tcache_gc_incr_bytes` is a size_t, read into one of its size.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                c"opt.tcache_gc_incr_bytes".as_ptr(),
                (&mut value as *mut usize).cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        assert_eq!(rc, 0);
        assert_eq!(value, 1 << 20);
    }
}
