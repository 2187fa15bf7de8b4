"""A KV-event publisher in the shape vLLM emits, written with pyzmq and
msgpack (not epp's code), to check epp's subscriber independently.

vLLM's ZmqEventPublisher: a PUB socket sends [topic, seq (8 bytes big-endian),
payload]; payload = msgpack of KVEventBatch encoded by msgspec with
array_like=True, omit_defaults=True: [ts, [event, ...]] where each event is a
tagged array ["BlockStored", block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium]. A ROUTER replay socket answers [b"", start_seq]
with every buffered [b"", seq, payload] from start_seq on, then
[b"", -1 (8 bytes), b""].

Script: publishes messages 0, 1 (integer hashes), withholds 2 (byte hashes,
buffered for replay only), publishes 3 (byte hashes, child of 2), 4 (removes
3's block, named by the integer its bytes end with) and a garbage payload as
5, then serves replay requests until killed. Prints "published" when done.

Usage: kv_publisher.py PUB_ENDPOINT REPLAY_ENDPOINT TOPIC
"""

import struct
import sys
import time

import msgpack
import zmq

pub_endpoint, replay_endpoint, topic = sys.argv[1], sys.argv[2], sys.argv[3].encode()

ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pub.bind(pub_endpoint)
replay = ctx.socket(zmq.ROUTER)
replay.bind(replay_endpoint)

buffer = []


def stored(hashes, parent, tokens, size=4):
    return ["BlockStored", hashes, parent, tokens, size, None, "GPU"]


def batch(*events):
    return msgpack.packb([time.time(), list(events)], use_bin_type=True)


def digest(n):
    # A 32-byte hash whose last 8 bytes are n, as newer vLLM sends.
    return b"\xab" * 24 + struct.pack(">Q", n)


messages = [
    batch(stored([101, 102], None, list(range(1, 9)))),
    batch(stored([103], 102, list(range(9, 13)))),
    batch(stored([digest(104)], 103, list(range(13, 17)))),
    batch(stored([digest(105)], digest(104), list(range(17, 21)))),
    batch(["BlockRemoved", [105], "GPU"]),
    b"\xc1 this is not msgpack",
]
withheld = {2}


def serve_replay(timeout_ms):
    if replay.poll(timeout_ms):
        ident, empty, start = replay.recv_multipart()
        start = struct.unpack(">q", start)[0]
        for seq, payload in buffer:
            if seq >= start:
                replay.send_multipart([ident, b"", struct.pack(">q", seq), payload])
        replay.send_multipart([ident, b"", struct.pack(">q", -1), b""])


# PUB/SUB drops what is sent before the subscriber has connected: wait for it.
time.sleep(float(sys.argv[4]) if len(sys.argv) > 4 else 2.0)
for seq, payload in enumerate(messages):
    buffer.append((seq, payload))
    if seq not in withheld:
        pub.send_multipart([topic, struct.pack(">Q", seq), payload])
    # Answer the replay the gap triggers before going on.
    serve_replay(300)
print("published", flush=True)
while True:
    serve_replay(1000)
