"""``python -m fedmedbench.deploy credentials``: TLS certificates and SuperNode keys for local use."""

from __future__ import annotations

import argparse

from fedmedbench.deploy import credentials


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fedmedbench.deploy")
    sub = parser.add_subparsers(dest="command", required=True)
    cred = sub.add_parser("credentials", help="a local CA, the SuperLink's certificate and one key pair per site")
    cred.add_argument("--out", required=True, help="folder for ca.crt, server.pem, server.key and keys/")
    cred.add_argument("--host", action="append", required=True,
                      help="a name or IP address the SuperLink is reached at (repeat for several)")
    cred.add_argument("--sites", type=int, required=True, help="number of sites (SuperNodes)")
    args = parser.parse_args(argv)
    tls = credentials.make_tls(args.out, args.host)
    print(f"CA certificate (give to every site): {tls.ca_cert}")
    print(f"SuperLink certificate and key: {tls.server_cert}, {tls.server_key}")
    for i in range(args.sites):
        private, public = credentials.make_node_key(f"{args.out}/keys", f"site{i:02d}")
        print(f"site {i}: private key {private} (stays at the site), public key {public} (register on the SuperLink)")


if __name__ == "__main__":
    main()
