//! The open-file limit the generator needs: one socket per subscriber (steady, never reading and
//! churning), the change source's, and a few more. A soft limit below that is raised towards the
//! hard one at the start (and said so on stderr); past the hard one the run stops with a clear
//! message rather than failing connections one by one.

/// Open files needed for `sockets` sockets, with room for the runtime, `/proc` reads and logs.
pub fn needed(sockets: usize) -> u64 {
    sockets as u64 + 256
}

/// Raises the soft `RLIMIT_NOFILE` to `need` if it is lower; `Err` when the hard limit is
/// lower than `need`. `Ok(Some((from, to)))` when it was raised.
pub fn raise_nofile(need: u64) -> Result<Option<(u64, u64)>, String> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(format!(
            "cannot read the open-file limit: {}",
            std::io::Error::last_os_error()
        ));
    }
    let (soft, hard): (u64, u64) = (lim.rlim_cur, lim.rlim_max);
    if soft >= need {
        return Ok(None);
    }
    if hard < need {
        return Err(format!(
            "{need} open files needed, the hard limit is {hard} (raise it: ulimit -Hn as root, or limits.conf)"
        ));
    }
    lim.rlim_cur = need as libc::rlim_t;
    // SAFETY: setrlimit reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(format!(
            "cannot raise the open-file limit to {need}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(Some((soft, need)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_already_enough_is_left_alone_and_one_past_the_hard_limit_is_refused() {
        assert_eq!(raise_nofile(1), Ok(None));
        assert!(raise_nofile(u64::MAX).is_err());
        assert_eq!(needed(1024), 1280);
    }
}
