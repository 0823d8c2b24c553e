"""The address a PS rank publishes: never the 127.0.1.1 a Debian host name resolves to."""

import pytest

from cpu_dist.common.addresses import (
    NodeInfo,
    choose_publish_address,
    interface_addresses,
    is_loopback,
    route_source,
    this_node,
)

pytestmark = pytest.mark.timeout(30)

PS = NodeInfo("node-a", ("10.0.0.5", "192.168.7.5"))
WORKER = NodeInfo("node-b", ("10.0.0.9",))


def routes(table):
    return lambda peer: table.get(peer)


def test_the_route_to_another_node_wins_over_the_host_name():
    chosen = choose_publish_address(
        PS,
        [WORKER, PS],
        route=routes({"10.0.0.9": "10.0.0.5"}),
        resolve=lambda host: "127.0.1.1",  # Debian's /etc/hosts entry for the host name
    )
    assert chosen == "10.0.0.5"


def test_a_loopback_host_name_is_never_published():
    # no route learnt (e.g. the peer's addresses are unknown): the interfaces decide
    chosen = choose_publish_address(
        PS, [PS, NodeInfo("node-b", ())], route=routes({}), resolve=lambda h: "127.0.1.1"
    )
    assert chosen == "10.0.0.5" and not is_loopback(chosen)


def test_a_routable_host_name_is_used_when_no_route_is_known():
    chosen = choose_publish_address(PS, [PS], route=routes({}), resolve=lambda host: "192.168.7.5")
    assert chosen == "192.168.7.5"


def test_a_route_through_an_address_of_another_host_is_not_taken():
    # the kernel's source address must be one of this node's own
    chosen = choose_publish_address(
        PS, [WORKER], route=routes({"10.0.0.9": "172.16.0.1"}), resolve=lambda h: None
    )
    assert chosen == "10.0.0.5"


def test_no_reachable_address_names_the_flags():
    lonely = NodeInfo("box", ())
    with pytest.raises(RuntimeError, match="--ps-host ADDR or --ps-interface NAME"):
        choose_publish_address(
            lonely, [lonely, WORKER], route=routes({}), resolve=lambda h: "127.0.1.1"
        )


def test_this_machine_describes_itself():
    node = this_node()
    assert all(not is_loopback(a) for a in node.addresses)
    assert "lo" in interface_addresses() and interface_addresses()["lo"] == "127.0.0.1"
    assert route_source("127.0.0.1") == "127.0.0.1"
