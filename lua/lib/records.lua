-- records.lua: node records decoded with cjson (node_record, text_field), never matched
-- in their text.
-- needs: (none)

-- A node record (JSON, as Python writes it) decoded, {} when it is not a JSON object:
-- its fields are read from the decoded table, never matched in the text. pcall: a record
-- arrives after the charge was written, and never makes the script raise.
local function node_record(json)
  local ok, node = pcall(cjson.decode, json)
  if ok and type(node) == 'table' then return node end
  return {}
end

-- A record's field when it is a non-empty string (cjson gives JSON null as cjson.null).
local function text_field(node, name)
  local v = node[name]
  if type(v) == 'string' and v ~= '' then return v end
  return nil
end
