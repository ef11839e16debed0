// The Java Kafka client calls Spark's format("kafka") makes, with the settings Spark gives them.
//
// Spark's Kafka connector (spark-sql-kafka-0-10) is a thin layer over kafka-clients: the driver
// plans offsets with an Admin (describeTopics, listOffsets earliest/latest/by timestamp), each
// executor task reads with a KafkaConsumer that assign()s one partition, seek()s and poll()s
// (group.id set, auto commit off, auto.offset.reset none; offsetsForTimes as older Spark plans), and each write task sends
// ProducerRecords with key, value, headers and an explicit partition through a KafkaProducer.
// This program makes those calls against a broker so tests can check the protocol the Java client
// speaks without Spark's connector jars. It prints one JSON object per line; bytes are hex.
//
// Usage: SparkKafkaCalls produce BOOTSTRAP TOPIC COUNT IDEMPOTENCE PAD
//        SparkKafkaCalls read BOOTSTRAP TOPIC TIMESTAMP FETCH_BYTES (max.partition.fetch.bytes)
// Record i (produce): partition i % partitions, key "k<i>" (null when i % 5 == 0), value "v<i>"
// followed by PAD dots (null when i % 7 == 3), headers [("i", "<i>"), ("none", null)] when i is
// odd, else none, timestamp 1714564800000 + i.

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class SparkKafkaCalls {
    static final long BASE_TS = 1714564800000L;

    public static void main(String[] args) throws Exception {
        String bootstrap = args[1];
        String topic = args[2];
        if (args[0].equals("produce")) {
            produce(bootstrap, topic, Integer.parseInt(args[3]), args[4], Integer.parseInt(args[5]));
        } else {
            read(bootstrap, topic, Long.parseLong(args[3]), args[4]);
        }
    }

    static Admin admin(String bootstrap) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("request.timeout.ms", "10000");
        p.put("default.api.timeout.ms", "20000");
        return Admin.create(p);
    }

    /** Spark's KafkaOffsetReaderAdmin: the topic's partitions, leaders included. */
    static List<TopicPartition> describe(Admin admin, String topic) throws Exception {
        TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
        List<TopicPartition> out = new ArrayList<>();
        for (TopicPartitionInfo info : d.partitions()) {
            out.add(new TopicPartition(topic, info.partition()));
            System.out.println("{\"describe\": " + info.partition() + ", \"leader\": " + info.leader().id()
                    + ", \"port\": " + info.leader().port() + "}");
        }
        return out;
    }

    static Map<TopicPartition, Long> offsets(Admin admin, List<TopicPartition> parts, OffsetSpec spec)
            throws Exception {
        Map<TopicPartition, OffsetSpec> ask = new HashMap<>();
        for (TopicPartition tp : parts) ask.put(tp, spec);
        Map<TopicPartition, Long> out = new HashMap<>();
        for (Map.Entry<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> e :
                admin.listOffsets(ask).all().get().entrySet()) {
            out.put(e.getKey(), e.getValue().offset());
        }
        return out;
    }

    static void produce(String bootstrap, String topic, int count, String idempotence, int pad)
            throws Exception {
        int partitions;
        try (Admin admin = admin(bootstrap)) {
            partitions = describe(admin, topic).size();
        }
        // Spark's KafkaWriter: the user's kafka.* options plus byte-array serializers.
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        p.put("enable.idempotence", idempotence);
        p.put("acks", "all");
        p.put("linger.ms", "5");
        p.put("delivery.timeout.ms", "30000");
        p.put("request.timeout.ms", "10000");
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            for (int i = 0; i < count; i++) {
                byte[] key = i % 5 == 0 ? null : ("k" + i).getBytes();
                byte[] value = i % 7 == 3 ? null : ("v" + i + ".".repeat(pad)).getBytes();
                List<Header> headers = new ArrayList<>();
                if (i % 2 == 1) {
                    headers.add(new RecordHeader("i", Integer.toString(i).getBytes()));
                    headers.add(new RecordHeader("none", null));
                }
                sent.add(producer.send(
                        new ProducerRecord<>(topic, i % partitions, BASE_TS + i, key, value, headers)));
            }
            producer.flush();
            for (int i = 0; i < count; i++) {
                RecordMetadata md = sent.get(i).get();
                System.out.println("{\"sent\": " + i + ", \"partition\": " + md.partition() + ", \"offset\": "
                        + md.offset() + ", \"timestamp\": " + md.timestamp() + "}");
            }
        }
    }

    static void read(String bootstrap, String topic, long timestamp, String fetchBytes) throws Exception {
        List<TopicPartition> parts;
        Map<TopicPartition, Long> earliest;
        Map<TopicPartition, Long> latest;
        try (Admin admin = admin(bootstrap)) {
            // subscribePattern lists every topic first.
            System.out.println("{\"listed\": " + admin.listTopics().names().get().contains(topic) + "}");
            parts = describe(admin, topic);
            earliest = offsets(admin, parts, OffsetSpec.earliest());
            latest = offsets(admin, parts, OffsetSpec.latest());
            Map<TopicPartition, Long> byTime = offsets(admin, parts, OffsetSpec.forTimestamp(timestamp));
            for (TopicPartition tp : parts) {
                System.out.println("{\"offsets\": " + tp.partition() + ", \"earliest\": " + earliest.get(tp)
                        + ", \"latest\": " + latest.get(tp) + ", \"by_timestamp\": " + byTime.get(tp) + "}");
            }
        }
        // Spark's executor consumer (KafkaSourceProvider.kafkaParamsForExecutors).
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("key.deserializer", ByteArrayDeserializer.class.getName());
        p.put("value.deserializer", ByteArrayDeserializer.class.getName());
        p.put("group.id", "spark-kafka-relation-ringlog-executor");
        p.put("enable.auto.commit", "false");
        p.put("auto.offset.reset", "none");
        p.put("receive.buffer.bytes", "65536");
        p.put("max.partition.fetch.bytes", fetchBytes);
        p.put("request.timeout.ms", "10000");
        p.put("default.api.timeout.ms", "20000");
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
            // A task checks the range still available when an offset is missing (failOnDataLoss).
            Map<TopicPartition, Long> first = consumer.beginningOffsets(parts);
            Map<TopicPartition, Long> last = consumer.endOffsets(parts);
            for (TopicPartition tp : parts) {
                System.out.println("{\"available\": " + tp.partition() + ", \"from\": " + first.get(tp)
                        + ", \"to\": " + last.get(tp) + "}");
            }
            // The consumer's own lookup by time (Spark's offset reader before its Admin one,
            // spark.sql.streaming.kafka.useDeprecatedOffsetFetching): it refuses an offset found
            // without the record's timestamp.
            Map<TopicPartition, Long> times = new HashMap<>();
            for (TopicPartition tp : parts) times.put(tp, timestamp);
            Map<TopicPartition, OffsetAndTimestamp> found = consumer.offsetsForTimes(times);
            for (TopicPartition tp : parts) {
                OffsetAndTimestamp at = found.get(tp);
                System.out.println("{\"for_time\": " + tp.partition() + ", \"offset\": " + at.offset()
                        + ", \"timestamp\": " + at.timestamp() + "}");
            }
            // One partition per task, as Spark reads: assign, seek to the planned start, poll to the end.
            for (TopicPartition tp : parts) {
                consumer.assign(List.of(tp));
                consumer.seek(tp, earliest.get(tp));
                long end = latest.get(tp);
                long deadline = System.currentTimeMillis() + 30000;
                while (consumer.position(tp) < end && System.currentTimeMillis() < deadline) {
                    for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(512))) {
                        if (r.offset() < end) print(r);
                    }
                }
            }
        }
    }

    static void print(ConsumerRecord<byte[], byte[]> r) {
        StringBuilder s = new StringBuilder();
        s.append("{\"topic\": \"").append(r.topic()).append("\", \"partition\": ").append(r.partition());
        s.append(", \"offset\": ").append(r.offset()).append(", \"timestamp\": ").append(r.timestamp());
        s.append(", \"timestamp_type\": \"").append(r.timestampType().name).append("\"");
        s.append(", \"key\": ").append(hex(r.key())).append(", \"value\": ").append(hex(r.value()));
        s.append(", \"headers\": [");
        String sep = "";
        for (Header h : r.headers()) {
            s.append(sep).append("[\"").append(h.key()).append("\", ").append(hex(h.value())).append("]");
            sep = ", ";
        }
        System.out.println(s.append("]}"));
    }

    static String hex(byte[] b) {
        return b == null ? "null" : "\"" + HexFormat.of().formatHex(b) + "\"";
    }
}
