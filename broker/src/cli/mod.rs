//! The command line: `serve`, `produce`, `consume`, `fetch`, `describe`,
//! `groups`, `split`, `demo` (and the demo's worker processes).
//!
//! Exit codes as the `fissionlog` tool's (docs/CLI.md): 0 ok, 1 refused or
//! problems found, 2 usage error or the server unreachable.

mod demo;
mod serve;
mod tools;

use clap::{Parser, Subcommand};
use fissionlog_broker::client::ClientError;
use fissionlog_broker::protocol::ErrorCode;

/// A failed command: its exit code and one sentence for stderr.
pub(crate) struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: 2,
            message: message.into(),
        }
    }
    pub fn refused(message: impl Into<String>) -> Failure {
        Failure {
            code: 1,
            message: message.into(),
        }
    }
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        let code = match &e {
            ClientError::Server {
                code:
                    ErrorCode::UnknownTopic
                    | ErrorCode::UnknownPartition
                    | ErrorCode::OffsetOutOfRange
                    | ErrorCode::InvalidRequest
                    | ErrorCode::UnknownGroup
                    | ErrorCode::UnsupportedVersion,
                ..
            } => 2,
            ClientError::Connect(_)
            | ClientError::Disconnected(_)
            | ClientError::Unavailable { .. } => 2,
            _ => 1,
        };
        Failure {
            code,
            message: e.to_string(),
        }
    }
}

pub(crate) type CmdResult = Result<(), Failure>;

#[derive(Parser)]
#[command(
    name = "fissionlog-broker",
    version,
    about = "A network broker on the fissionlog storage engine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a broker on a log directory.
    Serve(serve::ServeArgs),
    /// Produce stdin lines (KEY<TAB>VALUE) to a topic.
    Produce(tools::ProduceArgs),
    /// Consume a topic as a group member and print its records.
    Consume(tools::ConsumeArgs),
    /// Read one partition from an offset through its leader and print its records.
    Fetch(tools::FetchArgs),
    /// Describe a topic's partitions.
    Describe(tools::DescribeArgs),
    /// List consumer groups with their members, positions and lag.
    Groups(tools::GroupsArgs),
    /// Split a partition (forward, or moving its tail).
    Split(tools::SplitArgs),
    /// Run the distributed demo: a broker, producers and a consumer group as processes.
    Demo(demo::DemoArgs),
    #[command(hide = true)]
    DemoProducer(demo::ProducerArgs),
    #[command(hide = true)]
    DemoConsumer(demo::ConsumerArgs),
}

pub(crate) fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    let name = match &cli.command {
        Command::Serve(_) => "serve",
        Command::Produce(_) => "produce",
        Command::Consume(_) => "consume",
        Command::Fetch(_) => "fetch",
        Command::Describe(_) => "describe",
        Command::Groups(_) => "groups",
        Command::Split(_) => "split",
        Command::Demo(_) => "demo",
        Command::DemoProducer(_) => "demo-producer",
        Command::DemoConsumer(_) => "demo-consumer",
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fissionlog-broker {name}: cannot start the runtime: {e}");
            return 2;
        }
    };
    let r = rt.block_on(async move {
        match cli.command {
            Command::Serve(a) => serve::run(a).await,
            Command::Produce(a) => tools::produce(a).await,
            Command::Consume(a) => tools::consume(a).await,
            Command::Fetch(a) => tools::fetch(a).await,
            Command::Describe(a) => tools::describe(a).await,
            Command::Groups(a) => tools::groups(a).await,
            Command::Split(a) => tools::split(a).await,
            Command::Demo(a) => demo::run(a).await,
            Command::DemoProducer(a) => demo::producer(a).await,
            Command::DemoConsumer(a) => demo::consumer(a).await,
        }
    });
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    match r {
        Ok(()) => 0,
        Err(f) => {
            eprintln!("fissionlog-broker {name}: {}", f.message);
            f.code
        }
    }
}
