//! The command each host runs for `kolo COMMAND --hosts ...`: this process's own arguments, less the
//! placement options, plus the node's placement (`-n`, `--nnodes`, `--node-rank`, the store's address).

use std::ffi::OsString;
use std::path::PathBuf;

/// Options a node's command sets itself, with whether they take a value.
const NODE_SET: [(&str, bool); 9] = [
    ("-n", true),
    ("--nproc", true),
    ("--nproc-per-node", true),
    ("--hosts", true),
    ("--hostfile", true),
    ("--master-addr", true),
    ("--master-port", true),
    ("--nnodes", true),
    ("--node-rank", true),
];

/// `all` (a process's arguments, `kolo COMMAND ...`) after `kolo COMMAND`, without the options a
/// node's command sets itself, and the position of `--` in them (where the node options go), if any.
pub fn forwarded_args(all: impl Iterator<Item = OsString>) -> (Vec<OsString>, Option<usize>) {
    let mut out = Vec::new();
    let mut args = all.skip(2);
    let mut dashdash = None;
    while let Some(a) = args.next() {
        if a == "--" {
            dashdash = Some(out.len());
            out.push(a);
            out.extend(args.by_ref());
            break;
        }
        let text = a.to_string_lossy();
        let name = text.split('=').next().unwrap_or("");
        match NODE_SET.iter().find(|(n, _)| *n == name) {
            Some((_, takes_value)) => {
                if *takes_value && !text.contains('=') {
                    args.next();
                }
            }
            None if text.starts_with("-n") && text.len() > 2 && !text.starts_with("--") => {}
            None => out.push(a),
        }
    }
    (out, dashdash)
}

/// What every node's command shares.
#[derive(Clone, Debug)]
pub struct NodeCommand {
    /// The kolo executable.
    pub exe: PathBuf,
    /// The subcommand (`run`, `train`, `bench`).
    pub command: String,
    /// Workers per node.
    pub per_node: usize,
    /// Nodes in the job.
    pub nodes: usize,
    /// Where node 0's launcher hosts the store.
    pub master_addr: String,
    /// The store's port.
    pub master_port: u16,
    /// The forwarded arguments and the position of `--` in them ([`forwarded_args`]).
    pub rest: Vec<OsString>,
    /// Position of `--` in `rest`.
    pub dashdash: Option<usize>,
}

impl NodeCommand {
    /// The command line of node `i`: the forwarded arguments with the node's placement inserted
    /// before `--` (after everything when there is none), and `--watch-stdin` (a node's launcher
    /// stops when the connection that started it closes).
    pub fn for_node(&self, i: usize) -> Vec<OsString> {
        let mut node: Vec<OsString> = Vec::new();
        for (k, v) in [
            ("-n", self.per_node.to_string()),
            ("--nnodes", self.nodes.to_string()),
            ("--node-rank", i.to_string()),
            ("--master-addr", self.master_addr.clone()),
            ("--master-port", self.master_port.to_string()),
        ] {
            node.push(k.into());
            node.push(v.into());
        }
        if !self.rest.iter().any(|a| a == "--watch-stdin") {
            node.push("--watch-stdin".into());
        }
        let mut c: Vec<OsString> = vec![self.exe.clone().into(), self.command.clone().into()];
        match self.dashdash {
            Some(at) => {
                c.extend(self.rest[..at].iter().cloned());
                c.extend(node);
                c.extend(self.rest[at..].iter().cloned());
            }
            None => {
                c.extend(self.rest.iter().cloned());
                c.extend(node);
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<OsString> {
        s.split(' ').map(OsString::from).collect()
    }

    #[test]
    fn node_commands_keep_everything_but_the_placement() {
        let (rest, dd) = forwarded_args(
            argv("kolo run -n 8 --hosts a:4,b:4 --max-restarts 2 --master-port=7 -- prog -n 3 --hosts x")
                .into_iter(),
        );
        assert_eq!(rest, argv("--max-restarts 2 -- prog -n 3 --hosts x"));
        assert_eq!(dd, Some(2));
        let (rest, dd) =
            forwarded_args(argv("kolo train -n4 --hostfile h --model mlp --epochs 3").into_iter());
        assert_eq!(rest, argv("--model mlp --epochs 3"));
        assert_eq!(dd, None);
    }

    #[test]
    fn a_node_gets_its_placement_before_the_program() {
        let (rest, dashdash) =
            forwarded_args(argv("kolo run --hosts a:2,b:2 -n 4 -- prog --lr 1").into_iter());
        let c = NodeCommand {
            exe: PathBuf::from("/bin/kolo"),
            command: "run".into(),
            per_node: 2,
            nodes: 2,
            master_addr: "a".into(),
            master_port: 29500,
            rest,
            dashdash,
        };
        assert_eq!(
            c.for_node(1),
            argv(
                "/bin/kolo run -n 2 --nnodes 2 --node-rank 1 --master-addr a --master-port 29500 \
                 --watch-stdin -- prog --lr 1"
            )
        );
    }
}
