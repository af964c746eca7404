#!/usr/bin/env python3
"""Writes an OCI image archive (an image layout in a tar) from directories, one layer
each, with no registry and no image builder: what `ctr images import` loads into a
container runtime, and what `docker load` or `skopeo copy oci-archive:` read.

    oci_image.py --root DIR [--root DIR ...] --name REF --out FILE.tar
                 [--cmd ARG ...] [--entrypoint ARG ...] [--env K=V ...] [--user UID:GID]

Reproducible: each layer's entries sorted, owned by root, dated SOURCE_DATE_EPOCH
(default 0), gzip without a name or a time; the same directories give the same bytes,
so the image's digest names its content. Standard library only: testenv/node/build.sh
and deploy/docker/build.sh run it before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def layer_tar(root: Path) -> bytes:
    """The directory as one uncompressed layer, entries sorted and normalised."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*"), key=lambda p: p.relative_to(root).as_posix()):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(root).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = EPOCH
            info.pax_headers = {}
            if info.isfile():
                with path.open("rb") as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size, info.mtime, info.mode = len(data), EPOCH, 0o644
    tar.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}"


def _file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), EPOCH, 0o644
    tar.addfile(info, io.BytesIO(data))


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def write_image(roots: list[Path], name: str, out: Path, config: dict[str, object]) -> str:
    """Write the archive, one layer per directory (the first at the bottom); returns the
    manifest's digest. `config` is the image config's `config` (Cmd, Env, User, ...)."""
    raws = [layer_tar(root) for root in roots]
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {
            "type": "layers",
            "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest() for raw in raws],
        },
    }
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _file(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        layers = []
        for raw in raws:
            gz = gzip.compress(raw, compresslevel=6, mtime=0)
            layers.append({"mediaType": MEDIA_LAYER, "digest": _blob(tar, gz), "size": len(gz)})
        config_bytes = _json(image_config)
        conf = {
            "mediaType": MEDIA_CONFIG,
            "digest": _blob(tar, config_bytes),
            "size": len(config_bytes),
        }
        manifest = _json(
            {"schemaVersion": 2, "mediaType": MEDIA_MANIFEST, "config": conf, "layers": layers}
        )
        digest = _blob(tar, manifest)
        annotations = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": digest,
                    "size": len(manifest),
                    "annotations": annotations,
                    "platform": {"architecture": "amd64", "os": "linux"},
                }
            ],
        }
        _file(tar, "index.json", _json(index))
    tmp.rename(out)
    return digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--root", type=Path, action="append", required=True, help="a layer's files (repeat)"
    )
    parser.add_argument("--name", required=True, help="its reference, e.g. gpuheal.dev/x:1")
    parser.add_argument("--out", type=Path, required=True, help="the archive to write")
    parser.add_argument("--cmd", nargs="*", default=[], help="the default command")
    parser.add_argument("--entrypoint", nargs="*", default=[], help="the entrypoint")
    parser.add_argument("--env", nargs="*", default=[], help="KEY=VALUE, each")
    parser.add_argument("--user", default="", help="UID:GID the container runs as")
    args = parser.parse_args()
    config: dict[str, object] = {"Cmd": args.cmd, "Env": args.env, "WorkingDir": "/"}
    if args.entrypoint:
        config["Entrypoint"] = args.entrypoint
    if args.user:
        config["User"] = args.user
    digest = write_image(args.root, args.name, args.out, config)
    print(f"{args.name} {digest} {args.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
