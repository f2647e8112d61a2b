"""How many GETs a second moto's server on 127.0.0.1 answers, from boto3 on 1 and on 16 threads: the ceiling that
s3_loader.py's rates are to be read against.

    python results/h200-2026-12-01-s3/moto_ceiling.py [--objects 512] [--kb 104]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import boto3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--objects", type=int, default=512)
    parser.add_argument("--kb", type=int, default=104)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1",
                              config=boto3.session.Config(max_pool_connections=32))
        client.create_bucket(Bucket="bench")
        body = os.urandom(args.kb * 1024)
        for k in range(args.objects):
            client.put_object(Bucket="bench", Key=f"o/{k}", Body=body)
        for threads in (1, 16):
            start = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda k: client.get_object(Bucket="bench", Key=f"o/{k}")["Body"].read(),
                              range(args.objects)))
            took = time.perf_counter() - start
            print(json.dumps({"objects": args.objects, "kb": args.kb, "threads": threads,
                              "gets_s": round(args.objects / took, 1)}), flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
