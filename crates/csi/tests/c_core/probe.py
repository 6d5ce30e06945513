"""A gRPC C-core client (Python grpcio) with its default options, over `unix:`.

Calls Identity/Probe and Identity/GetPluginInfo on the CSI socket given as the only argument, with
hand-encoded messages (no generated stubs), and prints what came back. C-core sends its own default
`:authority` for a `unix:` target (grpcio 1.57 and later: the percent-encoded socket path), which is
what this client is for: nothing here overrides it.
"""

import sys

import grpc


def identity(b):
    return b


def field_string(message, number):
    """The first length-delimited field `number` of a protobuf message, as text (None when absent)."""
    i = 0
    while i < len(message):
        key, i = varint(message, i)
        wire = key & 7
        if wire == 2:
            size, i = varint(message, i)
            if key >> 3 == number:
                return message[i : i + size].decode()
            i += size
        elif wire == 0:
            _, i = varint(message, i)
        else:
            raise ValueError(f"unexpected wire type {wire}")
    return None


def varint(data, i):
    value = shift = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def main():
    socket = sys.argv[1]
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        call = lambda method: channel.unary_unary(  # noqa: E731
            method, request_serializer=identity, response_deserializer=identity
        )
        try:
            probe = call("/csi.v1.Identity/Probe")(b"", timeout=10)
            info = call("/csi.v1.Identity/GetPluginInfo")(b"", timeout=10)
        except grpc.RpcError as e:
            print(f"grpcio {grpc.__version__}: {e.code()}: {e.details()}")
            return 1
    # ProbeResponse.ready is a google.protobuf.BoolValue (field 1): present, empty when false.
    print(f"grpcio {grpc.__version__}: probe {probe.hex() or '(empty)'}")
    print(f"grpcio {grpc.__version__}: name {field_string(info, 1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
