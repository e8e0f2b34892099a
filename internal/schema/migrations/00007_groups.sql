-- +goose Up
-- Consumer groups: a consumer with a key splits its stream's rows by the
-- key's partition over the processes that run it. Its row in
-- weft_consumers names the group (a name is either a single consumer or a
-- group) and fixes the key (a top-level field of each row's JSON) and the
-- number of partitions; pos there is where the partitions started.
ALTER TABLE weft_consumers
    ADD COLUMN key text,
    ADD COLUMN partitions int CHECK (partitions BETWEEN 1 AND 4096);

-- A group's partitions. pos is the partition's cursor: every row of its
-- keys at or below it has been applied, in the transaction that moved it.
-- owner is the member (an instance ID) that runs it, NULL once released;
-- every take raises epoch. A member's batch locks the rows of its
-- partitions FOR UPDATE, in partition order, and runs only those it still
-- owns at the epoch of its take.
CREATE TABLE weft_group_partitions (
    stream text NOT NULL,
    name text NOT NULL,
    partition int NOT NULL,
    pos bigint NOT NULL CHECK (pos >= 0),
    epoch bigint NOT NULL DEFAULT 0,
    owner text,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream, name, partition),
    FOREIGN KEY (stream, name) REFERENCES weft_consumers (stream, name) ON DELETE CASCADE
);

-- A group's members: a row per process, live while lease_until is ahead
-- of the database clock. A graceful stop deletes it.
CREATE TABLE weft_group_members (
    stream text NOT NULL,
    name text NOT NULL,
    member text NOT NULL,
    lease_until timestamptz NOT NULL,
    joined_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream, name, member)
);

-- +goose Down
DROP TABLE weft_group_members;
DROP TABLE weft_group_partitions;
ALTER TABLE weft_consumers DROP COLUMN partitions, DROP COLUMN key;
