# shellcheck shell=bash
# Two "hosts" on one machine, sourced by netns-two-hosts.sh and netns-partition.sh: network
# namespaces $ns0 (10.77.0.1 on $if0) and $ns1 (10.77.0.2 on $if1) joined by a veth pair, no other
# interface but their own loopback. `netns_up TAG` makes them (deleted again on exit); it exits the
# calling script with 77 when namespaces cannot be made here (needs root and iproute2).
# `netns_limit RATE` slows their link; `netns_on_both OUT CMD...` runs a two-node kolo job on them.

netns_down() {
    ip netns del "$ns0" 2>/dev/null || true
    ip netns del "$ns1" 2>/dev/null || true
}

netns_up() {
    local tag=$1
    ns0="$tag-h0" ns1="$tag-h1" if0="$tag-a" if1="$tag-b"
    trap netns_down EXIT
    if ! ip netns add "$ns0" 2>/dev/null || ! ip netns add "$ns1" 2>/dev/null; then
        echo "netns: cannot create network namespaces here (needs root and iproute2)" >&2
        exit 77
    fi
    if ! { ip link add "$if0" type veth peer name "$if1" &&
        ip link set "$if0" netns "$ns0" &&
        ip link set "$if1" netns "$ns1" &&
        ip -n "$ns0" addr add 10.77.0.1/24 dev "$if0" &&
        ip -n "$ns1" addr add 10.77.0.2/24 dev "$if1" &&
        ip -n "$ns0" link set lo up &&
        ip -n "$ns1" link set lo up &&
        ip -n "$ns0" link set "$if0" up &&
        ip -n "$ns1" link set "$if1" up; } 2>/dev/null; then
        echo "netns: cannot make a veth pair between the namespaces here" >&2
        exit 77
    fi
}

# netns_limit RATE: limits both ends of the veth pair to RATE (tc's units: 1gbit, 200mbit) with a
# token bucket filter; packets over the rate wait (up to 50 ms) or are dropped, as on a slow link.
netns_limit() {
    local rate=$1 side ns iface
    for side in "$ns0 $if0" "$ns1 $if1"; do
        read -r ns iface <<<"$side"
        ip netns exec "$ns" tc qdisc add dev "$iface" root tbf rate "$rate" burst 256kb latency 50ms
    done
}

# netns_on_both OUT CMD...: runs `CMD --nnodes 2 --node-rank R ...` on both hosts at once; node R's
# output goes to OUT.nodeR.log. Fails (showing the log) if either fails.
netns_on_both() {
    local out=$1 port=$((29500 + RANDOM % 400)) r pids=()
    shift
    for r in 0 1; do
        local ns iface
        ns=$([[ $r == 0 ]] && echo "$ns0" || echo "$ns1")
        iface=$([[ $r == 0 ]] && echo "$if0" || echo "$if1")
        ip netns exec "$ns" env RAYON_NUM_THREADS=1 timeout 900 "$@" --nnodes 2 --node-rank "$r" \
            --master-addr 10.77.0.1 --master-port "$port" --iface "$iface" >"$out.node$r.log" 2>&1 &
        pids+=($!)
    done
    for r in 0 1; do
        if ! wait "${pids[$r]}"; then
            echo "netns: node $r failed ($*):" >&2
            tail -5 "$out.node$r.log" >&2
            exit 1
        fi
    done
}
