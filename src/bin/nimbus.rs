//! The `nimbus` command line (`nimbus::cli`): start, inspect and stop
//! cluster nodes.

fn main() {
    nimbus::cli::main()
}
