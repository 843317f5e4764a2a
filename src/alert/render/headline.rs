//! The headline of a message: what happened, in one line, per kind of message.

use super::{what, Words};
use crate::alert::{Lang, Message, Status, Subject};

/// The headline of `m` (the title after the severity tag).
pub(super) fn headline(w: &Words, m: &Message) -> String {
    let lang = w.lang;
    let first = m.items.first();
    match &m.subject {
        Subject::Route => match first {
            Some(i) => format!("{} {}", i.route, what(w, i)),
            None => w.t("route alert", "线路告警").to_owned(),
        },
        Subject::Provider { provider } => {
            let mode = first.map(|i| what(w, i)).unwrap_or_default();
            let n = m.route_count();
            // Routes judged on a shared cause: the cause comes first, it is what to act on.
            let cause = m
                .items
                .iter()
                .filter(|i| i.reason_code == "shared_cause")
                .find_map(|i| crate::health::cause::parts(&i.reason_text));
            match (lang, n, cause) {
                (Lang::En, n, Some((class, host, _, _))) => {
                    format!("{provider}: {class} at {host} — {n} routes {mode}")
                }
                (Lang::Zh, n, Some((class, host, _, _))) => format!(
                    "{provider}：{host} {} —— {n} 条线路{mode}",
                    crate::health::cause::class_zh(class)
                ),
                (Lang::En, 1, None) => format!("{provider}: 1 route {mode}"),
                (Lang::En, n, None) => format!("{provider}: {n} routes {mode}"),
                (Lang::Zh, n, None) => format!("{provider}：{n} 条线路{mode}"),
            }
        }
        Subject::Egress { providers } => match lang {
            Lang::En => format!(
                "our own egress is failing ({} providers, {} routes)",
                providers.len(),
                m.route_count()
            ),
            Lang::Zh => format!(
                "本机出口网络故障({} 个服务商，{} 条线路)",
                providers.len(),
                m.route_count()
            ),
        },
        Subject::RequestSide => {
            let route = first.map(|i| i.route.to_string()).unwrap_or_default();
            match lang {
                Lang::En => format!("{route}: real requests fail while probes succeed"),
                Lang::Zh => format!("{route}：真实请求失败但探测正常"),
            }
        }
        Subject::Flapping {
            transitions,
            window_s,
        } => {
            let route = first.map(|i| i.route.to_string()).unwrap_or_default();
            let win = w.dur(i64::try_from(*window_s).unwrap_or(i64::MAX));
            let n = m.items.len();
            let provider = first.map(|i| i.route.split().0).unwrap_or_default();
            match (lang, n) {
                (Lang::En, 0 | 1) => {
                    format!("{route} is flapping ({transitions} state changes in {win})")
                }
                (Lang::Zh, 0 | 1) => format!("{route} 状态反复抖动({win} 内 {transitions} 次变化)"),
                (Lang::En, _) => format!(
                    "{provider}: {n} routes are flapping (up to {transitions} state changes in {win})"
                ),
                (Lang::Zh, _) => {
                    format!("{provider}：{n} 条线路状态反复抖动({win} 内最多 {transitions} 次变化)")
                }
            }
        }
        Subject::BurnRate(b) => {
            let kind = match (lang, b.page) {
                (Lang::En, true) => "page",
                (Lang::En, false) => "ticket",
                (Lang::Zh, true) => "紧急",
                (Lang::Zh, false) => "工单",
            };
            match lang {
                Lang::En => format!(
                    "{}: error budget burning {:.1}× ({kind})",
                    b.route, b.burn_long
                ),
                Lang::Zh => format!("{}：错误预算消耗 {:.1} 倍({kind})", b.route, b.burn_long),
            }
        }
        Subject::Heartbeat { job, silent_s } => {
            let d = w.dur(i64::try_from(*silent_s).unwrap_or(i64::MAX));
            let named = match (crate::heartbeat::what(job), lang) {
                (Some((en, _)), Lang::En) => format!("{job} ({en})"),
                (Some((_, zh)), Lang::Zh) => format!("{job}（{zh}）"),
                (None, _) => job.clone(),
            };
            match (lang, m.status) {
                (Lang::En, Status::Resolved) => format!("monitoring job {named} beating again"),
                (Lang::Zh, Status::Resolved) => format!("监控任务 {named} 已恢复心跳"),
                (Lang::En, _) => {
                    format!("monitoring job {named} silent for {d} — figures may be stale")
                }
                (Lang::Zh, _) => format!("监控任务 {named} 已 {d} 无心跳 —— 数据可能已过时"),
            }
        }
        Subject::Drift(d) => match (lang, d.kind.as_str()) {
            (Lang::En, "model_changed") => {
                format!(
                    "{}: reported model changed (regression set {})",
                    d.route, d.set
                )
            }
            (Lang::Zh, "model_changed") => {
                format!("{}：上报的模型版本变化(回归集 {})", d.route, d.set)
            }
            (Lang::En, "capability_lost") => format!(
                "{}: {} capability lost while chat still answers (capability_lost: {})",
                d.route, d.set, d.set
            ),
            (Lang::Zh, "capability_lost") => format!(
                "{}：对话正常但 {} 能力失效(capability_lost: {})",
                d.route, d.set, d.set
            ),
            (Lang::En, "long_prompt_slow") => format!(
                "{}: long prompts slow to a first token, short ones fine (long_prompt_slow)",
                d.route
            ),
            (Lang::Zh, "long_prompt_slow") => format!(
                "{}：长提示词首 token 变慢，短请求正常(long_prompt_slow)",
                d.route
            ),
            (Lang::En, "embedding_changed") => format!(
                "{}: embedding model changed under the same name — vectors no longer match the reference",
                d.route
            ),
            (Lang::Zh, "embedding_changed") => format!(
                "{}：同名之下的向量模型已被更换 —— 向量与基准不再一致",
                d.route
            ),
            (Lang::En, kind) => format!(
                "{}: behaviour changed on regression set {} ({kind})",
                d.route, d.set
            ),
            (Lang::Zh, kind) => format!("{}：回归集 {} 上行为变化({kind})", d.route, d.set),
        },
        Subject::Switch { serves, action } => match (lang, action.as_str()) {
            (Lang::En, "switch") => format!("{serves}: traffic switched to the backup"),
            (Lang::Zh, "switch") => format!("{serves}：流量已切换到备用线路"),
            (Lang::En, "blocked") => format!("{serves}: switch to a backup refused"),
            (Lang::Zh, "blocked") => format!("{serves}：切换到备用线路被拒绝"),
            (Lang::En, "abort") => format!("{serves}: canary return aborted, back on the backup"),
            (Lang::Zh, "abort") => format!("{serves}：灰度回切失败，流量回到备用线路"),
            (Lang::En, "returned") => format!("{serves}: back on the primaries"),
            (Lang::Zh, "returned") => format!("{serves}：已回切到主线路"),
            (Lang::En, _) => format!("{serves}: canary return in progress"),
            (Lang::Zh, _) => format!("{serves}：灰度回切中"),
        },
        Subject::RouteFault { route, status } => {
            match (lang, status) {
                (Lang::En, Some(s)) => {
                    format!("{route}: upstream answers HTTP {s} — our key, account or model name is wrong")
                }
                (Lang::Zh, Some(s)) => {
                    format!("{route}：上游返回 HTTP {s} —— 我方密钥、账户或模型名有误")
                }
                (Lang::En, None) => format!("{route}: answers normally again"),
                (Lang::Zh, None) => format!("{route}：已恢复正常应答"),
            }
        }
        Subject::ExtraCost { used, limit } => match lang {
            Lang::En => {
                format!("extra-cost budget at {used:.2} of {limit:.2} this hour: no new switch")
            }
            Lang::Zh => format!("本小时额外成本预算已用 {used:.2} / {limit:.2}：不再切换"),
        },
        Subject::VantageStale { vantage } => match (lang, m.status) {
            (Lang::En, Status::Resolved) => format!("vantage {vantage} reports again"),
            (Lang::En, _) => format!("vantage {vantage} stopped reporting (left the quorum)"),
            (Lang::Zh, Status::Resolved) => format!("探测点 {vantage} 恢复上报"),
            (Lang::Zh, _) => format!("探测点 {vantage} 停止上报(已退出判定)"),
        },
        Subject::SyncFailed { kind, gateway } => match (lang, m.status) {
            (Lang::En, Status::Resolved) => {
                format!("{kind} {gateway}: channel writes succeed again")
            }
            (Lang::En, _) => format!("{kind} {gateway}: channel writes refused (sync_failed)"),
            (Lang::Zh, Status::Resolved) => format!("{kind} {gateway}：渠道写入已恢复"),
            (Lang::Zh, _) => format!("{kind} {gateway}：渠道写入被拒绝(sync_failed)"),
        },
        Subject::ProviderDeclared { provider, what } => match (lang, m.status) {
            (Lang::En, Status::Resolved) => {
                format!("{provider}: the provider no longer declares {what}")
            }
            (Lang::En, _) => format!(
                "{provider} declares {what} on its status page; our probes still find its routes normal (provider_declared)"
            ),
            (Lang::Zh, Status::Resolved) => format!("{provider}：服务商已不再声明 {what}"),
            (Lang::Zh, _) => format!(
                "{provider} 在其状态页声明：{what}；我方探测仍判定其线路正常(provider_declared)"
            ),
        },
        Subject::RateLimitLow { route, limit } => match (lang, m.status) {
            (Lang::En, Status::Resolved) => {
                format!("{route}: {limit} rate limit has headroom again")
            }
            (Lang::En, _) => {
                format!("{route}: under 10% of the {limit} rate limit left for 5 minutes (ratelimit_low)")
            }
            (Lang::Zh, Status::Resolved) => format!("{route}：{limit} 限流余量已恢复"),
            (Lang::Zh, _) => {
                format!("{route}：{limit} 限流余量低于 10% 已持续 5 分钟(ratelimit_low)")
            }
        },
        Subject::ModelWithdrawn { region, model } => match (lang, m.status) {
            (Lang::En, Status::Resolved) => format!("{region}: model {model} is listed again"),
            (Lang::En, _) => format!(
                "{region}: model {model} withdrawn from the provider's model list (model_withdrawn)"
            ),
            (Lang::Zh, Status::Resolved) => {
                format!("{region}：模型 {model} 已重新出现在模型列表中")
            }
            (Lang::Zh, _) => {
                format!("{region}：模型 {model} 已从服务商的模型列表中下架(model_withdrawn)")
            }
        },
        Subject::ModelRetiring {
            route,
            retires,
            days_left,
        } => match lang {
            Lang::En => format!(
                "{route}: the model retires on {retires}, in {days_left} day(s) (model_retiring)"
            ),
            Lang::Zh => {
                format!("{route}：模型将于 {retires} 下线，还剩 {days_left} 天(model_retiring)")
            }
        },
        Subject::Grouped {
            provider,
            kind,
            members,
        } => super::grouped::headline(w, m, provider, kind, members.len()),
        Subject::Folded {
            total, per_minute, ..
        } => super::grouped::folded_headline(w, *total, *per_minute),
        Subject::Test => w
            .t(
                "test message from probeok: this channel works",
                "probeok 测试消息：此通道可用",
            )
            .to_owned(),
    }
}
