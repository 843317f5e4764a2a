//! The `probeok` binary: clap → tracing → config → the command. Everything else is in the lib.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use probeok::cli;

#[derive(Parser)]
#[command(
    name = "probeok",
    version,
    about = "Probe LLM providers, judge them, publish the truth."
)]
struct Cli {
    /// Log output format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Pretty)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Pretty,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole service. Without a config (and no PROBEOK_CONFIG) runs the built-in demo.
    Serve {
        #[arg(long, env = "PROBEOK_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Run the routing proxy alone, following a remote monitor's weights feed.
    Proxy {
        #[arg(long, env = "PROBEOK_CONFIG")]
        config: PathBuf,
        /// The monitor's base URL (e.g. http://monitor:9400); without it, configured weights.
        #[arg(long)]
        weights_from: Option<String>,
    },
    /// Probe the routes a [[vantage]] assigns to this place and push the outcomes to a monitor.
    Agent {
        #[arg(long, env = "PROBEOK_CONFIG")]
        config: PathBuf,
        /// The [[vantage]] id this agent is.
        #[arg(long)]
        vantage: String,
        /// The monitor's base URL (e.g. http://monitor:9400).
        #[arg(long)]
        server: String,
        /// The outbox file (default ./probeok-agent-<ID>.db).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Where /healthz and /metrics listen.
        #[arg(long, default_value = probeok::agent::DEFAULT_LISTEN)]
        listen: std::net::SocketAddr,
    },
    /// Validate a config and print the routes it defines.
    CheckConfig {
        #[arg(long, env = "PROBEOK_CONFIG")]
        config: PathBuf,
    },
    /// Fire one probe per route now and print the results.
    Probe {
        #[arg(long, env = "PROBEOK_CONFIG")]
        config: PathBuf,
        /// Only this route (`provider/region/model`).
        #[arg(long)]
        route: Option<String>,
        /// One JSON object per route instead of a table.
        #[arg(long)]
        json: bool,
        /// Also write the outcomes to the store.
        #[arg(long)]
        record: bool,
    },
    /// Alert channels.
    Alert {
        #[command(subcommand)]
        command: AlertCommand,
    },
    /// Run the regression sets now on every route they apply to and print the report.
    Regress {
        #[arg(long, env = "PROBEOK_CONFIG")]
        config: PathBuf,
        /// Only this set (by name).
        #[arg(long)]
        set: Option<String>,
        /// One JSON object per (route, set) run instead of the report.
        #[arg(long)]
        json: bool,
    },
    /// Planned traffic moves through a running monitor's admin API (token from
    /// PROBEOK_ADMIN_TOKEN).
    Drill {
        #[command(subcommand)]
        command: DrillCommand,
    },
    /// Copy a SQLite store into the PostgreSQL store named by an environment variable, and
    /// verify the row counts of every table.
    MigrateStore {
        #[arg(long, env = "PROBEOK_CONFIG")]
        config: PathBuf,
        /// The SQLite database file to copy.
        #[arg(long)]
        from: PathBuf,
        /// The environment variable holding the target's postgres:// URL.
        #[arg(long)]
        to_env: String,
        /// Empty a target that already holds rows instead of refusing it.
        #[arg(long)]
        replace: bool,
    },
    /// Run the simulated OpenAI-compatible providers standalone.
    Simulate {
        #[arg(long, default_value = "127.0.0.1:9410")]
        listen: std::net::SocketAddr,
        #[arg(long, default_value = "healthy")]
        scenario: String,
        /// How many times faster than real time the scenario's timeline runs.
        #[arg(long, default_value_t = 1.0)]
        time_scale: f64,
    },
}

#[derive(Subcommand)]
enum DrillCommand {
    /// Start a drill: move traffic off a route for a while (gradually with --ramp).
    Start {
        /// The monitor's base URL, e.g. http://127.0.0.1:9400.
        #[arg(long)]
        server: String,
        /// The route (`provider/region/model`).
        #[arg(long)]
        route: String,
        /// The route's weight at the end of the ramp.
        #[arg(long, default_value_t = 0)]
        weight: u8,
        /// How long, e.g. 15m (at most `[drill] max_duration`).
        #[arg(long)]
        duration: String,
        /// Why (recorded and shown on the status page).
        #[arg(long)]
        reason: String,
        /// Stages as percentages of the move, e.g. 5,25,100.
        #[arg(long)]
        ramp: Option<String>,
        /// Start outside the off-peak windows.
        #[arg(long)]
        force: bool,
        /// Who starts it (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Stop the drill on a route, or every active drill.
    Stop {
        #[arg(long)]
        server: String,
        #[arg(long)]
        route: Option<String>,
    },
    /// Print a drill's report.
    Report {
        #[arg(long)]
        server: String,
        /// The drill's id.
        id: String,
        /// The server's JSON instead of the report for people.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum AlertCommand {
    /// Send a test message to each alert channel and print what each receiver answered.
    Test {
        #[arg(long, env = "PROBEOK_CONFIG")]
        config: PathBuf,
        /// Only this channel: 0-based over dingtalk, feishu, email, webhook, wecom tables in that order.
        #[arg(long)]
        channel: Option<usize>,
    },
}

fn main() -> ExitCode {
    probeok::malloc::tune();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version are not errors; a bad command line is invalid input (exit 1).
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    cli::init_tracing(matches!(cli.log_format, LogFormat::Json));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Serve { config } => cli::serve(config.as_deref()).await,
            Command::CheckConfig { config } => cli::check_config(&config),
            Command::Agent {
                config,
                vantage,
                server,
                data,
                listen,
            } => cli::agent(&config, vantage, server, data, listen).await,
            Command::Proxy {
                config,
                weights_from,
            } => cli::proxy(&config, weights_from.as_deref()).await,
            Command::Probe {
                config,
                route,
                json,
                record,
            } => cli::probe(&config, route.as_deref(), json, record).await,
            Command::Alert {
                command: AlertCommand::Test { config, channel },
            } => cli::alert_test(&config, channel).await,
            Command::Regress { config, set, json } => {
                cli::regress(&config, set.as_deref(), json).await
            }
            Command::Drill { command } => match command {
                DrillCommand::Start {
                    server,
                    route,
                    weight,
                    duration,
                    reason,
                    ramp,
                    force,
                    by,
                } => probeok::drill::client::start(&probeok::drill::client::StartArgs {
                    server,
                    route,
                    weight,
                    duration,
                    reason,
                    ramp,
                    force,
                    started_by: by,
                })
                .await
                .map_err(Into::into),
                DrillCommand::Stop { server, route } => {
                    probeok::drill::client::stop(&server, route.as_deref())
                        .await
                        .map_err(Into::into)
                }
                DrillCommand::Report { server, id, json } => {
                    probeok::drill::client::report(&server, &id, json)
                        .await
                        .map_err(Into::into)
                }
            },
            Command::MigrateStore {
                config,
                from,
                to_env,
                replace,
            } => cli::migrate_store(&config, &from, &to_env, replace).await,
            Command::Simulate {
                listen,
                scenario,
                time_scale,
            } => cli::simulate(listen, &scenario, time_scale).await,
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            for line in e.lines() {
                eprintln!("{line}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}
