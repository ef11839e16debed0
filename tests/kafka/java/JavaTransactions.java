// The Java client's transactional API, as a consume-transform-produce application uses it:
// initTransactions, send, sendOffsetsToTransaction with the consumer's group metadata (KIP-447),
// commitTransaction and abortTransaction, a zombie fenced by a second producer of its
// transactional.id (ProducerFencedException on its next call), and a read_committed KafkaConsumer.
// It prints one JSON object per line for the test to check.
//
// Usage: JavaTransactions BOOTSTRAP INPUT OUTPUT
// INPUT gets 10 records "r0".."r9"; OUTPUT, read read_committed at the end, must hold "t0".."t9"
// once each: t0-t4 from the first transaction, t5-t9 from the fencing producer's, nothing of the
// aborted transaction ("aborted") nor of the zombie's ("zombie"); the group's offset on INPUT is 10.

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class JavaTransactions {
    static final String GROUP = "java-eos";

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String input = args[1];
        String output = args[2];
        TopicPartition in0 = new TopicPartition(input, 0);

        try (KafkaProducer<String, String> plain = new KafkaProducer<>(producerProps(bootstrap, null))) {
            for (int i = 0; i < 10; i++) plain.send(new ProducerRecord<>(input, 0, "k" + i, "r" + i)).get();
        }

        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(consumerProps(bootstrap, GROUP));
                KafkaProducer<String, String> zombie =
                        new KafkaProducer<>(producerProps(bootstrap, "java-txn"))) {
            consumer.subscribe(List.of(input));
            List<ConsumerRecord<String, String>> in = new ArrayList<>();
            long deadline = System.currentTimeMillis() + 30000;
            while (in.size() < 10 && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) in.add(r);
            }
            System.out.println("{\"consumed\": " + in.size() + "}");

            zombie.initTransactions();
            zombie.beginTransaction();
            for (int i = 0; i < 5; i++) zombie.send(transformed(output, in.get(i), "t"));
            zombie.sendOffsetsToTransaction(Map.of(in0, new OffsetAndMetadata(5)), consumer.groupMetadata());
            zombie.commitTransaction();
            System.out.println("{\"committed\": 5}");

            zombie.beginTransaction();
            for (int i = 5; i < 10; i++) zombie.send(transformed(output, in.get(i), "aborted"));
            // Sent and stored before the abort: the client drops batches not yet sent when a
            // transaction aborts (its sender sends the offsets' requests first), and the
            // read_uncommitted check below is of aborted records in the log.
            zombie.flush();
            zombie.sendOffsetsToTransaction(Map.of(in0, new OffsetAndMetadata(10)), consumer.groupMetadata());
            zombie.abortTransaction();
            System.out.println("{\"aborted\": 5}");

            // An open transaction, then a second producer of the id: its initTransactions aborts the
            // open one and fences this producer, whose commit then fails.
            zombie.beginTransaction();
            zombie.send(transformed(output, in.get(5), "zombie")).get();
            try (KafkaProducer<String, String> next =
                    new KafkaProducer<>(producerProps(bootstrap, "java-txn"))) {
                next.initTransactions();
                String fenced = "none";
                try {
                    zombie.commitTransaction();
                } catch (ProducerFencedException e) {
                    fenced = "ProducerFencedException";
                } catch (Exception e) {
                    fenced = e.getClass().getSimpleName();
                }
                System.out.println("{\"fenced\": \"" + fenced + "\"}");

                next.beginTransaction();
                for (int i = 5; i < 10; i++) next.send(transformed(output, in.get(i), "t"));
                next.sendOffsetsToTransaction(Map.of(in0, new OffsetAndMetadata(10)), consumer.groupMetadata());
                next.commitTransaction();
                System.out.println("{\"committed\": 10}");
            }
            OffsetAndMetadata at = consumer.committed(java.util.Set.of(in0)).get(in0);
            System.out.println("{\"group_offset\": " + (at == null ? -1 : at.offset()) + "}");
        }

        for (String isolation : new String[] {"read_committed", "read_uncommitted"}) {
            Properties p = consumerProps(bootstrap, "java-eos-reader");
            p.put("isolation.level", isolation);
            try (KafkaConsumer<String, String> reader = new KafkaConsumer<>(p)) {
                List<TopicPartition> parts = new ArrayList<>();
                reader.partitionsFor(output).forEach(i -> parts.add(new TopicPartition(output, i.partition())));
                reader.assign(parts);
                reader.seekToBeginning(parts);
                Map<TopicPartition, Long> end = reader.endOffsets(parts);
                List<String> values = new ArrayList<>();
                long deadline = System.currentTimeMillis() + 30000;
                while (System.currentTimeMillis() < deadline && !atEnd(reader, end)) {
                    for (ConsumerRecord<String, String> r : reader.poll(Duration.ofMillis(200))) values.add(r.value());
                }
                StringBuilder s = new StringBuilder("{\"" + isolation + "\": [");
                for (int i = 0; i < values.size(); i++) s.append(i == 0 ? "\"" : ", \"").append(values.get(i)).append("\"");
                System.out.println(s.append("]}"));
            }
        }
    }

    static boolean atEnd(KafkaConsumer<String, String> reader, Map<TopicPartition, Long> end) {
        for (Map.Entry<TopicPartition, Long> e : end.entrySet()) {
            if (reader.position(e.getKey()) < e.getValue()) return false;
        }
        return true;
    }

    static ProducerRecord<String, String> transformed(String output, ConsumerRecord<String, String> r, String prefix) {
        return new ProducerRecord<>(output, 0, r.key(), prefix + r.value().substring(1));
    }

    static Properties producerProps(String bootstrap, String transactionalId) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        p.put("request.timeout.ms", "10000");
        p.put("delivery.timeout.ms", "30000");
        p.put("max.block.ms", "30000");
        if (transactionalId != null) p.put("transactional.id", transactionalId);
        return p;
    }

    static Properties consumerProps(String bootstrap, String group) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("key.deserializer", StringDeserializer.class.getName());
        p.put("value.deserializer", StringDeserializer.class.getName());
        p.put("group.id", group);
        p.put("enable.auto.commit", "false");
        p.put("auto.offset.reset", "earliest");
        p.put("isolation.level", "read_committed");
        p.put("request.timeout.ms", "10000");
        p.put("default.api.timeout.ms", "20000");
        return p;
    }
}
