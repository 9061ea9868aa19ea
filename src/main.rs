//! The `change-streamer` binary: parse the configuration, run the service (as the owner or a
//! standby of a shared change DB, [`instance::run`]), stop it gracefully on SIGINT or
//! SIGTERM (SIGHUP reloads the secrets and TLS pair instead, `reload`). Also the backup
//! monitor's VFS reader, when run with [`vfs_reader::SUBCOMMAND`].

use change_streamer::config;
use change_streamer::instance;
use change_streamer::shutdown::wait_for_signal;
use change_streamer_actors::vfs_reader;

fn main() -> std::process::ExitCode {
    // The VFS reader the backup monitor starts (PROTOCOL.md §8.1b) is this binary run with a hidden
    // subcommand; it is not a flag, so it is recognised before the flags are parsed.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == vfs_reader::SUBCOMMAND)
    {
        return vfs_reader::run();
    }
    let (config, matches) = config::parse_or_exit();
    let log_format = config.log_format;
    change_streamer::log_format::init(log_format);
    let system = actix_rt::System::new();
    let result = system.block_on(async move {
        let clock = change_streamer_actors::clock::Clock::System;
        instance::run(config, clock, wait_for_signal()).await?;
        actix_rt::System::current().stop();
        Ok::<(), change_streamer::StartError>(())
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line, on stderr, whether or not logging is on (PROTOCOL.md §2: in the
            // `--log-format`).
            let message = format!(
                "change-streamer: {e}{}",
                config::env_sources(&matches, e.flags())
            );
            change_streamer::log_format::print_start_error(log_format, &message);
            std::process::ExitCode::FAILURE
        }
    }
}
