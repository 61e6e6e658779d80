"""``python -m fedmedbench.deploy credentials``: TLS certificates and SuperNode keys for local use;
``python -m fedmedbench.deploy superlink|supernode ARGS``: Flower's SuperLink or SuperNode, started only with TLS
and node authentication (``deploy/launch.py``); ``superexec ARGS``: the SuperExec such a SuperLink starts itself."""

from __future__ import annotations

import argparse
import sys

from fedmedbench.deploy import credentials, launch


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in launch.STARTED_BY_SUPERLINK:
        launch.run_started_by_superlink(argv[0], argv[1:])
        return
    if argv and argv[0] in launch.PROGRAMS:  # the rest goes to Flower's program unchanged
        try:
            launch.run(argv[0], argv[1:])
        except launch.InsecureDeploymentError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        return
    parser = argparse.ArgumentParser(prog="python -m fedmedbench.deploy")
    sub = parser.add_subparsers(dest="command", required=True)
    cred = sub.add_parser("credentials", help="a local CA, the SuperLink's certificate and one key pair per site")
    cred.add_argument("--out", required=True, help="folder for ca.crt, server.pem, server.key and keys/")
    cred.add_argument("--host", action="append", required=True,
                      help="a name or IP address the SuperLink is reached at (repeat for several)")
    cred.add_argument("--sites", type=int, required=True, help="number of sites (SuperNodes)")
    for role, program in launch.PROGRAMS.items():
        sub.add_parser(role, help=f"{program} ARGS, refused without TLS and node authentication unless "
                                  f"{launch.FLAG} is given")
    args = parser.parse_args(argv)
    tls = credentials.make_tls(args.out, args.host)
    print(f"CA certificate (give to every site): {tls.ca_cert}")
    print(f"SuperLink certificate and key: {tls.server_cert}, {tls.server_key}")
    for i in range(args.sites):
        private, public = credentials.make_node_key(f"{args.out}/keys", f"site{i:02d}")
        print(f"site {i}: private key {private} (stays at the site), public key {public} (register on the SuperLink)")


if __name__ == "__main__":
    main()
