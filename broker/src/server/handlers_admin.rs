//! Admin requests: topics, describe, split, merge, tail split, hot-key
//! mode, groups, stats. Each answers one JSON document (docs/PROTOCOL.md).

use fissionlog::{GroupOptions, PartitionInfo, Topic};
use serde_json::{json, Value};

use super::auth::Access;
use super::conn::Conn;
use super::handlers::{
    blocking as run_blocking, hot_key_mode, json_reply, lib, refused as refusal, split_plan,
    tail_options, topic_config, topic_for as topic_checked,
};
use crate::protocol::{ErrorCode, Request, Response};

type Reply = Result<Response, (ErrorCode, String)>;

fn hex(h: u64) -> String {
    format!("{h:#018x}")
}

fn child_json(t: &Topic, id: u32) -> Value {
    match t.partitions().into_iter().find(|p| p.id == id) {
        Some(p) => {
            json!({"id": p.id, "key_start": hex(p.start), "key_end": hex(p.end), "parents": p.parents})
        }
        None => json!({"id": id}),
    }
}

fn partition_json(p: &PartitionInfo) -> Value {
    let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.insert("key_start".into(), json!(hex(p.start)));
        m.insert("key_end".into(), json!(hex(p.end)));
        m.insert(
            "state".into(),
            json!(if p.sealed_at.is_some() {
                "sealed"
            } else {
                "active"
            }),
        );
    }
    v
}

fn admin_allowed(conn: &Conn, topic: Option<&str>) -> Result<(), (ErrorCode, String)> {
    if conn
        .shared
        .config
        .authorizer
        .allow(&conn.principal, Access::Admin(topic))
    {
        Ok(())
    } else {
        Err(refusal(
            ErrorCode::Unauthorized,
            "admin requests are not allowed",
        ))
    }
}

pub(crate) async fn admin(conn: &Conn, req: Request) -> Reply {
    let opcode = req.opcode();
    match req {
        Request::CreateTopic {
            topic,
            partitions,
            sync,
            max_record_bytes,
            target_bytes_per_sec,
            auto_balance,
        } => {
            admin_allowed(conn, Some(&topic))?;
            let cfg = topic_config(
                partitions,
                sync,
                max_record_bytes,
                target_bytes_per_sec,
                auto_balance,
            );
            let log = conn.shared.log.clone();
            let t = run_blocking(move || log.create_topic(&topic, cfg))
                .await?
                .map_err(lib)?;
            json_reply(
                opcode,
                json!({"topic": t.name(), "partitions": t.active_partitions()}),
            )
        }
        Request::ListTopics => {
            admin_allowed(conn, None)?;
            json_reply(opcode, json!({"topics": conn.shared.log.topics()}))
        }
        Request::Describe { topic } => {
            let t = topic_checked(conn, &topic, Access::Admin(Some(&topic)))?;
            let parts: Vec<Value> = t.partitions().iter().map(partition_json).collect();
            let hot: Vec<Value> = t
                .hot_keys()
                .into_iter()
                .map(|k| json!({"hash": hex(k.hash), "mode": format!("{:?}", k.mode), "lanes": k.lanes}))
                .collect();
            json_reply(
                opcode,
                json!({"topic": t.name(), "generation": t.topology_generation(), "partitions": parts, "hot_keys": hot}),
            )
        }
        Request::Split {
            topic,
            partition,
            plan,
        } => {
            let t = topic_checked(conn, &topic, Access::Admin(Some(&topic)))?;
            let plan = split_plan(&t, &plan);
            let t2 = t.clone();
            let children = run_blocking(move || t2.split(partition, plan))
                .await?
                .map_err(lib)?;
            tracing::info!(topic = t.name(), partition, ?children, "split");
            let c: Vec<Value> = children.iter().map(|&id| child_json(&t, id)).collect();
            json_reply(
                opcode,
                json!({"topic": t.name(), "parent": partition, "children": c}),
            )
        }
        Request::Merge { topic, a, b } => {
            let t = topic_checked(conn, &topic, Access::Admin(Some(&topic)))?;
            let t2 = t.clone();
            let child = run_blocking(move || t2.merge(a, b)).await?.map_err(lib)?;
            tracing::info!(topic = t.name(), a, b, child, "merge");
            json_reply(
                opcode,
                json!({"topic": t.name(), "parents": [a, b], "child": child_json(&t, child)}),
            )
        }
        Request::TailSplit {
            topic,
            partition,
            plan,
            from,
        } => {
            let t = topic_checked(conn, &topic, Access::Admin(Some(&topic)))?;
            let plan = split_plan(&t, &plan);
            let t2 = t.clone();
            let out = run_blocking(move || t2.split_tail(partition, plan, tail_options(from)))
                .await?
                .map_err(lib)?;
            tracing::info!(topic = t.name(), partition, children = ?out.children, "tail split");
            let c: Vec<Value> = out.children.iter().map(|&id| child_json(&t, id)).collect();
            json_reply(
                opcode,
                json!({"topic": t.name(), "parent": partition, "children": c,
                       "moved": {"from": out.from, "to": out.seal_offset, "records": out.moved, "copied_bytes": out.copied_bytes}}),
            )
        }
        Request::SetHotKeyMode {
            topic,
            key,
            mode,
            lanes,
        } => {
            let t = topic_checked(conn, &topic, Access::Admin(Some(&topic)))?;
            let m = hot_key_mode(mode);
            let t2 = t.clone();
            let k = key.clone();
            run_blocking(move || {
                if lanes == 0 {
                    t2.set_hot_key_mode(&k, m)
                } else {
                    t2.set_hot_key_mode_lanes(&k, m, lanes)
                }
            })
            .await?
            .map_err(lib)?;
            let lanes_now = t.key_lanes(&key).eras.last().map_or(1, |e| e.lanes.len());
            json_reply(
                opcode,
                json!({"topic": t.name(), "key_hash": hex(t.hash(&key)), "mode": format!("{m:?}"), "lanes": lanes_now}),
            )
        }
        Request::ListGroups { topic } => {
            admin_allowed(conn, topic.as_deref())?;
            let names = match &topic {
                Some(t) => vec![t.clone()],
                None => conn.shared.log.topics(),
            };
            let mut groups = Vec::new();
            for name in names {
                let t = conn.shared.log.topic(&name).map_err(lib)?;
                for g in t.groups() {
                    let grp = t.group(&g, GroupOptions::default()).map_err(lib)?;
                    let d = grp.describe();
                    let parts: Vec<Value> = d
                        .assignments
                        .iter()
                        .map(|a| json!({"partition": a.partition, "committed": a.committed, "lag_records": a.lag_records, "member": a.member}))
                        .collect();
                    groups.push(json!({"topic": name, "group": d.name, "generation": d.generation,
                        "lag_records": d.lag_records, "partitions": parts, "members": d.members, "stats": d.stats}));
                }
            }
            json_reply(opcode, json!({"groups": groups}))
        }
        Request::Stats => {
            admin_allowed(conn, None)?;
            json_reply(
                opcode,
                serde_json::to_value(conn.shared.stats.snapshot()).unwrap_or(Value::Null),
            )
        }
        other => Err(refusal(
            ErrorCode::InvalidRequest,
            format!("unexpected request {:#04x}", other.opcode()),
        )),
    }
}
