//! `--engines_nice N`: the simulated engines' threads (rank threads, registrations and
//! heartbeats, ZeroMQ I/O, the drivers) run at nice N, while the HTTP clients that measure
//! kvdir stay at the tool's own priority. In a fleet the engines run on other machines; on one
//! shared machine a lower priority for them is the nearest thing, and the report says so.
//!
//! Linux keeps a nice value per thread (`setpriority(PRIO_PROCESS, tid)`), and a new thread
//! starts with its creator's: the threads running when the load starts are lowered from the
//! main thread, the drivers lower themselves, and the clients, started from the main thread,
//! keep its priority. Raising a nice value needs no privilege.

use std::io;

use rustix::process::{setpriority_process, Pid};
use rustix::thread::gettid;

/// Sets every thread of this process but the calling one to nice `n`; answers how many.
pub fn lower_others(n: i32) -> io::Result<usize> {
    let me = gettid();
    let mut lowered = 0;
    for entry in std::fs::read_dir("/proc/self/task")? {
        let name = entry?.file_name();
        let tid = name.to_str().and_then(|t| t.parse::<i32>().ok()).and_then(Pid::from_raw);
        if let Some(tid) = tid.filter(|&t| t != me) {
            // A thread that ended since the listing is no error.
            if setpriority_process(Some(tid), n).is_ok() {
                lowered += 1;
            }
        }
    }
    Ok(lowered)
}

/// Sets the calling thread to nice `n`.
pub fn lower_this_thread(n: i32) -> io::Result<()> {
    Ok(setpriority_process(Some(gettid()), n)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::process::getpriority_process;

    #[test]
    fn others_are_lowered_and_the_caller_keeps_its_priority() {
        let mine = getpriority_process(Some(gettid())).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            tx.send(gettid()).unwrap();
            done_rx.recv().unwrap();
            getpriority_process(Some(gettid())).unwrap()
        });
        let tid = rx.recv().unwrap();
        let target = (mine + 5).min(19);
        assert!(lower_others(target).unwrap() >= 1);
        assert_eq!(getpriority_process(Some(tid)).unwrap(), target);
        assert_eq!(getpriority_process(Some(gettid())).unwrap(), mine, "the caller keeps its own");
        done_tx.send(()).unwrap();
        assert_eq!(other.join().unwrap(), target);
    }
}
