//! The VFS reader as a program of its own: see [`change_streamer_actors::vfs_reader`].

fn main() -> std::process::ExitCode {
    change_streamer_actors::vfs_reader::run()
}
