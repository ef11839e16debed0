"""A Bytewax dataflow (bytewax 0.21, its Kafka connector on confluent-kafka), as a user would
write it, run unchanged against `broker serve` by test_bytewax.py in Bytewax's own venv
(scripts/setup_apps.sh), with Bytewax's runner:

    python -m bytewax.run 'bytewax_copy.py:flow("127.0.0.1:9092", "events", "copied")'

It copies every record of the input topic, from its beginning to the end it finds (no tail), to
the output topic, key and value as they are, upper-casing the value on the way so the copy is
seen to have passed through the flow. The output topic is auto-created by the sink's first
produce.
"""

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaSinkMessage
from bytewax.connectors.kafka import operators as kop
from bytewax.dataflow import Dataflow


def flow(bootstrap: str, source: str, sink: str) -> Dataflow:
    dataflow = Dataflow("copy")
    consumed = kop.input("read", dataflow, brokers=[bootstrap], topics=[source], tail=False)
    upper = op.map("upper", consumed.oks, lambda msg: KafkaSinkMessage(msg.key, msg.value.upper()))
    kop.output("write", upper, brokers=[bootstrap], topic=sink)
    return dataflow
