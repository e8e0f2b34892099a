-- +goose Up
-- A group member's progress record: every partition of parts, which the
-- member owns, has every row at or below pos applied, in the transaction
-- that wrote it. A batch of a member whose partitions have not changed
-- writes only this row (pos), whatever the partitions its rows fall in;
-- the partitions' own cursors then lag, and a partition's true cursor is
-- the greater of its row's pos and the pos of its owner's record that
-- lists it (weft_group_cursors). gen is raised by every write: a member
-- commits a batch through it only at the gen it last wrote, and every
-- take, release or seek of a partition the record lists locks the record
-- and folds it into the partition's row (taking the partition out of
-- parts) first, so a member whose partition was taken commits nothing.
CREATE TABLE weft_group_progress (
    stream text NOT NULL,
    name text NOT NULL,
    member text NOT NULL,
    gen bigint NOT NULL DEFAULT 0,
    parts int[] NOT NULL DEFAULT '{}',
    pos bigint NOT NULL DEFAULT 0 CHECK (pos >= 0),
    PRIMARY KEY (stream, name, member),
    FOREIGN KEY (stream, name) REFERENCES weft_consumers (stream, name) ON DELETE CASCADE
) WITH (fillfactor = 50);

-- Every partition's true cursor: the greater of its row's and its
-- owner's progress record's, when the record lists it.
CREATE VIEW weft_group_cursors AS
SELECT p.stream, p.name, p.partition, p.owner, p.epoch, greatest(p.pos, r.pos) AS pos
FROM weft_group_partitions p
LEFT JOIN (SELECT g.stream, g.name, g.member, g.pos, u.part FROM weft_group_progress g, unnest(g.parts) AS u(part)) AS r
    ON r.stream = p.stream AND r.name = p.name AND r.member = p.owner AND r.part = p.partition;

-- +goose Down
DROP VIEW weft_group_cursors;
DROP TABLE weft_group_progress;
